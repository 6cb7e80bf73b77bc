"""Which part of a Llama-family model each rank holds, and the sizes that can be split at all.

Tensor parallelism splits attention heads, KV heads, the MLP's intermediate size and the vocabulary evenly
over a stage's ranks; pipeline parallelism splits the decoder layers over the stages. A slice is
(start, count) in the unsplit model's units (heads, rows, tokens)."""
from __future__ import annotations

from typing import Any, NamedTuple

from pagedllm.distributed.ranks import ParallelRanks

# Each rank's vocabulary slice is padded to a multiple of this, as vLLM pads the vocabulary.
VOCAB_PADDING = 64

Slice = tuple[int, int]  # (start, count)


class KVCacheShape(NamedTuple):
    """What a worker's KV cache holds: one (K, V) pair per local layer of [num_kv_heads, blocks, block, head_dim]."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


def head_dim(hf_config: Any) -> int:
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


def even_slice(total: int, rank: int, size: int) -> Slice:
    """Rank's share of `total` units split evenly (verify_parallel_sizes checked that they divide)."""
    count = total // size
    return rank * count, count


def kv_head_slice(num_kv_heads: int, rank: int, size: int) -> Slice:
    """Rank's KV heads. With more ranks than KV heads each rank keeps one, replicated over the tp / kv ranks
    whose query heads share it (as vLLM does)."""
    if size <= num_kv_heads:
        return even_slice(num_kv_heads, rank, size)
    return rank // (size // num_kv_heads), 1


def vocab_slice(vocab_size: int, rank: int, size: int) -> tuple[Slice, int]:
    """Rank's slice of the vocabulary (possibly empty on the last ranks) and the rows it allocates for it:
    every rank the same, padded to VOCAB_PADDING, so that the gathered logits line up rank after rank. One
    rank alone holds exactly the vocabulary."""
    if size == 1:
        return (0, vocab_size), vocab_size
    per_rank = -(-vocab_size // size)
    padded = -(-per_rank // VOCAB_PADDING) * VOCAB_PADDING
    start = min(rank * padded, vocab_size)
    return (start, min(padded, vocab_size - start)), padded


def layer_slice(num_layers: int, pp_rank: int, pp_size: int) -> Slice:
    """Stage's decoder layers, split as vLLM does: evenly, the remainder one each to the stages before the
    last (which also runs the LM head), the latest first."""
    counts = [num_layers // pp_size] * pp_size
    for i in range(num_layers % pp_size):
        counts[pp_size - 2 - i] += 1
    return sum(counts[:pp_rank]), counts[pp_rank]


def local_kv_cache_shape(hf_config: Any, ranks: ParallelRanks) -> KVCacheShape:
    """The KV cache a worker allocates: its stage's layers, its own KV heads."""
    _, layers = layer_slice(hf_config.num_hidden_layers, ranks.pp_rank, ranks.pp_size)
    _, kv_heads = kv_head_slice(hf_config.num_key_value_heads, ranks.tp_rank, ranks.tp_size)
    return KVCacheShape(layers, kv_heads, head_dim(hf_config))


def verify_parallel_sizes(hf_config: Any, tensor_parallel_size: int, pipeline_parallel_size: int) -> None:
    """Raise ValueError, in vLLM's wording, where the model cannot be split this way."""
    for name, size in (("tensor_parallel_size", tensor_parallel_size),
                       ("pipeline_parallel_size", pipeline_parallel_size)):
        if size < 1:
            raise ValueError(f"{name} must be at least 1, got {size}.")
    tp = tensor_parallel_size
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads  # an encoder has no KV heads of its own
    if heads % tp:
        raise ValueError(f"Total number of attention heads ({heads}) must be divisible by tensor parallel size "
                         f"({tp}).")
    if tp <= kv_heads and kv_heads % tp:
        raise ValueError(f"Total number of key-value heads ({kv_heads}) must be divisible by tensor parallel "
                         f"size ({tp}).")
    if tp > kv_heads and tp % kv_heads:
        raise ValueError(f"Tensor parallel size ({tp}) must be a multiple of the total number of key-value heads "
                         f"({kv_heads}) to replicate them.")
    if hf_config.intermediate_size % tp:
        raise ValueError(f"Intermediate size ({hf_config.intermediate_size}) must be divisible by tensor parallel "
                         f"size ({tp}).")
    if pipeline_parallel_size > hf_config.num_hidden_layers:
        raise ValueError(f"Pipeline parallel size ({pipeline_parallel_size}) must not exceed the number of hidden "
                         f"layers ({hf_config.num_hidden_layers}).")
