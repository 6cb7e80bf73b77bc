"""Which decode graphs a model runner gets, and which steps a graph takes: the decisions CPU graphs
(cpu_graph.py) and CUDA graphs (cuda_graph.py) share."""
from __future__ import annotations

import bisect
from typing import Optional, Sequence

import torch

from pagedllm.worker.batch import ModelInput

# vLLM's default capture list for `cuda_graph_sizes=[N]`: 1, 2, 4, then every multiple of 8 up to N.
_SMALL_SIZES = (1, 2, 4)
_SIZE_STEP = 8


def graph_kind(device: torch.device, dtype: torch.dtype, enforce_eager: bool, world_size: int) -> Optional[str]:
    """"cpu" (CPU graphs of the C kernels, which serve float32), "cuda" (CUDA graphs, any dtype) or None (every
    step eager). A graph replays one process's kernels: tensor parallelism's all-reduces and a pipeline stage's
    sends are not kernel calls, so sharded models run eagerly, as does `enforce_eager=True`."""
    if enforce_eager or world_size > 1:
        return None
    if device.type == "cuda":
        return "cuda"
    if device.type == "cpu" and dtype == torch.float32:
        return "cpu"
    return None


def capture_sizes(cuda_graph_sizes: Sequence[int], max_num_seqs: int) -> list[int]:
    """The decode batch sizes to capture, ascending, as vLLM reads `cuda_graph_sizes`: one value N means 1, 2,
    4 and the multiples of 8 up to N; several values are the sizes themselves. Sizes past the first one that
    holds `max_num_seqs` are never used and are dropped."""
    if len(cuda_graph_sizes) == 1:
        limit = cuda_graph_sizes[0]
        sizes = [s for s in _SMALL_SIZES if s <= limit] + list(range(_SIZE_STEP, limit + 1, _SIZE_STEP))
    else:
        sizes = sorted(set(cuda_graph_sizes))
    enough = bisect.bisect_left(sizes, max_num_seqs)
    return sizes[:enough + 1]


def padded_size(num_rows: int, sizes: list[int]) -> Optional[int]:
    """The smallest captured size (ascending `sizes`) that holds `num_rows` decode rows, or None if none does."""
    index = bisect.bisect_left(sizes, num_rows)
    return sizes[index] if index < len(sizes) else None


def graph_rows(batch: ModelInput, max_rows: int, max_blocks: int, prefill_tokens: bool = False) -> Optional[int]:
    """The step's number of rows if a graph can run it, else None: decode rows (a verification row counts as
    one) and, where the graph takes them (`prefill_tokens`: CPU graphs), prefill tokens laid out for the
    token-by-token kernel, each a row; at most `max_rows` rows, block tables no wider than the graph's
    (`max_blocks`), and no prompt position given as an embedding (a graph embeds token ids)."""
    meta = batch.attn_metadata
    prefill = meta.num_prefill_tokens
    if prefill and (not prefill_tokens or meta.prefill_token_tables is None):
        return None
    rows = prefill + meta.num_decodes
    widest = max(meta.decode_block_tables.shape[1], meta.prefill_block_tables.shape[1] if prefill else 0)
    if not 0 < rows <= max_rows or widest > max_blocks or batch.prompt_embeds is not None:
        return None
    return rows
