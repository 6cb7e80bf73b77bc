"""Paged attention on CUDA: one Triton kernel that reads keys and values in place through the block tables.

The kernel computes what the CPU's C kernel computes (attention.py): every query token attends to its
sequence's first `len` cached keys, where `len` counts the token itself, so causal masking within a prefill
chunk, attention to cached context (chunked prefill, prefix hits) and the proposed tokens of speculative
verification are one rule. A program takes a tile of consecutive query tokens of one sequence together with
the query heads that share one KV head, so each key block read from the cache serves all of them, and walks the
keys in steps of BLOCK_N with an online softmax in float32.

Decode rows are tiles of one token whose metadata is the step's decode block tables and context lengths as
they are: nothing is built per step, so a CUDA graph (worker/cuda_graph.py) captures the kernel over its
static buffers. Prefill tiles are laid out once per step from the host-side prefill groups and sequences.

Triton is imported on first use: the CPU path never needs it. Its interpreter (TRITON_INTERPRET=1, set
before triton is imported) runs the same kernel on CPU tensors, which is how the tests check it without a GPU.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch

from pagedllm.device_tensor import device_tensor

# Query rows (tokens x heads of a KV head's group) per program, and keys per inner step. tl.dot needs at
# least 16 on each side.
_MIN_ROWS = 16
_PREFILL_ROWS = 64
BLOCK_N = 32


def serves(device: torch.device) -> bool:
    """Whether attention on `device` runs this kernel: on CUDA, where Triton imports (it ships with PyTorch's
    CUDA builds; without it attention falls back to PyTorch's operators over gathered blocks)."""
    return device.type == "cuda" and triton_imports()


@functools.cache
def triton_imports() -> bool:
    """Whether triton imports here (checked once)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def paged_attention_triton(q: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor], meta: Any,
                           scale: float) -> torch.Tensor:
    """q [T, heads, d] of a step whose keys and values are already in the cache -> [T, heads, d].

    meta is the step's AttentionMetadata: prefill tokens first, laid out in `meta.prefill_block_tables`
    row order, then one decode row per token."""
    out = torch.empty_like(q)
    prefill = meta.num_prefill_tokens
    if prefill:
        tiles = prefill_tiles(meta, tokens_per_tile(q.shape[1] // kv_cache[0].shape[0], _PREFILL_ROWS), q.device)
        _launch(q, kv_cache, out, meta.prefill_block_tables, tiles, None, 0, scale)
    if meta.num_decodes:
        _launch(q, kv_cache, out, meta.decode_block_tables, None, meta.decode_context_lens, prefill, scale)
    return out


def tokens_per_tile(group: int, rows: int) -> int:
    """Query tokens per program so that tokens x (group padded to a power of two) fills `rows` rows."""
    padded = 1 << (group - 1).bit_length()
    return max(1, rows // padded)


def prefill_tiles(meta: Any, tile_tokens: int, device: torch.device) -> torch.Tensor:
    """[4, tiles] int32: per tile its sequence's row in the prefill block tables, its first flat token, its
    number of tokens and the keys its first token attends to. Cached on the metadata: every layer of the step
    reads the same tiles."""
    if meta.triton_prefill_tiles is not None:
        return meta.triton_prefill_tiles
    # (query start, query length, keys before the first query token) of each prefill sequence, in table order.
    sequences = [(g.query_start + i * g.query_len, g.query_len, 0)
                 for g in meta.prefill_groups for i in range(g.num_seqs)]
    sequences += [(s.query_start, s.query_len, s.context_len - s.query_len) for s in meta.prefills]
    columns = [[], [], [], []]
    for row, (start, length, before) in enumerate(sequences):
        for first in range(0, length, tile_tokens):
            for column, value in zip(columns, (row, start + first, min(tile_tokens, length - first),
                                               before + first + 1)):
                column.append(value)
    tiles = device_tensor(columns, torch.int32, device)
    meta.triton_prefill_tiles = tiles
    return tiles


def _launch(q: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor,
            block_tables: torch.Tensor, tiles: Optional[torch.Tensor], decode_lens: Optional[torch.Tensor],
            token_offset: int, scale: float) -> None:
    """One kernel launch over prefill tiles ([4, N]) or decode rows (one token each, `decode_lens` [B])."""
    tile_meta = decode_lens if tiles is None else tiles
    args, constants = kernel_arguments(q, kv_cache, out, block_tables, tile_meta, tiles is None, token_offset, scale)
    _kernel()[(tile_meta.shape[-1], kv_cache[0].shape[0])](*args, **constants)


def kernel_arguments(q: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor,
                     block_tables: torch.Tensor, tile_meta: torch.Tensor, decode: bool, token_offset: int,
                     scale: float) -> tuple[tuple, dict[str, Any]]:
    """The kernel's runtime arguments and its compile-time constants for one launch (the tests compile the
    kernel for a GPU from them)."""
    key_cache, value_cache = kv_cache
    heads, dim = q.shape[1], q.shape[2]
    kv_heads, _, block_size, _ = key_cache.shape
    group = heads // kv_heads
    args = (q, key_cache, value_cache, out, block_tables, tile_meta, scale,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), block_tables.stride(0),
            token_offset, tile_meta.shape[-1], block_size, dim, group)
    constants = dict(
        GROUP_PADDED=1 << (group - 1).bit_length(),
        TILE_TOKENS=tokens_per_tile(group, _MIN_ROWS if decode else _PREFILL_ROWS),
        DIM_PADDED=max(16, 1 << (dim - 1).bit_length()), BLOCK_N=BLOCK_N, DECODE=decode,
        # float32 stays float32 (Triton's default would round the products' inputs to TF32).
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    return args, constants


@functools.cache
def _kernel() -> Callable:
    """The Triton kernel, imported on first use so that importing this module never imports triton."""
    from pagedllm.model.triton_paged_kernel import paged_attention_kernel

    return paged_attention_kernel
