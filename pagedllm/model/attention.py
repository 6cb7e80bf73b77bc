"""Attention over a paged KV cache.

Each layer's cache is a pair of tensors [kv_heads, num_blocks, block_size, head_dim] (block axis second):
gathering a batch's blocks along that axis yields keys already laid out [kv_heads, batch, context, d],
which batched matmuls read without a further copy. A request's tokens live in the blocks its block table
lists. One step's tokens are laid out prefill sequences first (each a run of query tokens, possibly after
already cached context), then decode tokens (one per request).

On CPU in float32 a C kernel (cpu_kernels.py) reads the blocks in place for every query token, prefill and
decode alike, each token on its own over the cached keys in block order. So a token's attention is the
same computation whether it is decoded or prefilled, in one chunk or several, alone or in a batch of any mix:
with the linear layers and element-wise kernels also reducing each row on its own, a request's tokens and
logprobs are bitwise independent of its batch (batch invariance). On CUDA a Triton kernel
(triton_attention.py) follows the same rule, each query token over its sequence's blocks in place, in tiles.
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from pagedllm.model import triton_attention
from pagedllm.model.cpu_kernels import AttentionKernel, layer_ops_for, load_attention_kernel, serves
from pagedllm.model.layers import RotaryEmbedding, RotaryPositions

KVCache = tuple[torch.Tensor, torch.Tensor]
# Each cache tensor is [kv_heads, num_blocks, block_size, head_dim]: blocks sit on this dimension.
BLOCK_DIM = 1


@dataclass
class PrefillGroup:
    """Consecutive prefill sequences with nothing cached before them and the same length: one causal
    attention call covers them all."""

    query_start: int
    num_seqs: int
    query_len: int


@dataclass
class PrefillSequence:
    """A prefill chunk that attends to context already in the cache (chunked prefill, prefix hit)."""

    query_start: int  # offset of its first query token in the step's flat token list
    query_len: int
    context_len: int  # tokens attended to, the query included
    block_table: torch.Tensor  # [num_blocks] long


@dataclass
class AttentionMetadata:
    """How one step's flat token list maps onto sequences and cache slots; built once per step and shared by
    every layer."""

    slot_mapping: torch.Tensor  # [T] long: flat cache slot of each token's K/V
    prefill_groups: list[PrefillGroup]
    prefills: list[PrefillSequence]  # those with cached context
    num_prefill_tokens: int
    decode_block_tables: torch.Tensor  # [B, max_blocks] long: each decode's blocks, padded with its first block
    decode_context_lens: torch.Tensor  # [B] long: keys each decode attends to, its own included
    # For the token-by-token kernel: each prefill sequence's blocks [P, max_blocks] (padded as decodes'), and
    # per prefill token [num_prefill_tokens] its sequence's row there and the keys it attends to.
    prefill_block_tables: Optional[torch.Tensor] = None
    prefill_token_tables: Optional[torch.Tensor] = None
    prefill_token_lens: Optional[torch.Tensor] = None
    triton_prefill_tiles: Optional[torch.Tensor] = None  # on CUDA: laid out on first use (triton_attention.py)

    @property
    def num_decodes(self) -> int:
        return self.decode_context_lens.shape[0]


def allocate_kv_cache(num_blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                      device: torch.device) -> KVCache:
    """Zeroed key and value caches of one layer. On CPU they live in anonymous memory maps, which the kernel
    hands out zeroed and backs with memory only where written, so a large cache costs nothing until used."""
    shape = (kv_heads, num_blocks, block_size, head_dim)
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)
    nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    # Private maps: each first write costs a page fault, a fifth cheaper than in shared ones (measured).
    return tuple(torch.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), dtype=dtype)
                 .view(shape) for _ in range(2))


def write_kv(kv_cache: KVCache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store this step's K/V [T, kv_heads, d] into their slots."""
    for cache, new in zip(kv_cache, (k, v)):
        cache.view(cache.shape[0], -1, cache.shape[-1]).index_copy_(1, slot_mapping, new.transpose(0, 1))


def store_rotated_kv(qkv: torch.Tensor, heads: int, rotary: RotaryPositions, kv_cache: KVCache,
                     meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Apply the rotary embedding to a step's merged projections qkv [T, heads + 2 * kv_heads, d] and store
    its keys and values in the cache; returns q, k, v as views of qkv (rotated in place on CPU)."""
    kv_heads = kv_cache[0].shape[0]
    ops = layer_ops_for(qkv)
    if ops is not None:
        ops.rope_and_cache(qkv, rotary.cos_table, rotary.sin_table, rotary.positions, meta.slot_mapping, *kv_cache,
                           heads)
        return qkv.split([heads, kv_heads, kv_heads], dim=1)
    # q and k are adjacent in the merged output: one rotation covers both.
    qk = RotaryEmbedding.apply(qkv[:, :heads + kv_heads], rotary.cos_sin)
    q, k = qk.split([heads, kv_heads], dim=1)
    v = qkv[:, heads + kv_heads:]
    write_kv(kv_cache, k, v, meta.slot_mapping)
    return q, k, v


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q [T, heads, d], k/v [T, kv_heads, d] of this step, whose keys and values are already in the cache;
    returns [T, heads, d]."""
    # Metadata built without the per-token tables (only build_model_input lays them out) takes PyTorch's path.
    has_tables = not meta.num_prefill_tokens or meta.prefill_token_tables is not None
    if has_tables and triton_attention.serves(q.device):
        return triton_attention.paged_attention_triton(q, kv_cache, meta, scale)
    kernel = _attention_kernel(q, kv_cache)
    if kernel is not None and has_tables:
        return _token_attention(kernel, q, kv_cache, meta, scale)
    if not meta.num_prefill_tokens:
        return _gathered_decode_attention(q, kv_cache, meta, scale)
    out = torch.empty_like(q)
    for group in meta.prefill_groups:
        rows = slice(group.query_start, group.query_start + group.num_seqs * group.query_len)
        out[rows] = _causal_attention(q[rows], k[rows], v[rows], group, scale)
    for seq in meta.prefills:
        rows = slice(seq.query_start, seq.query_start + seq.query_len)
        out[rows] = _context_attention(q[rows], kv_cache, seq, scale)
    if meta.num_decodes:
        out[meta.num_prefill_tokens:] = _gathered_decode_attention(q[meta.num_prefill_tokens:], kv_cache, meta,
                                                                   scale)
    return out


def _attention_kernel(q: torch.Tensor, kv_cache: KVCache) -> Optional[AttentionKernel]:
    """The C kernel for this model's shape where it serves q (CPU, float32) and could be built, else None."""
    if not serves(q):
        return None
    heads, kv_heads, block_size = q.shape[1], kv_cache[0].shape[0], kv_cache[0].shape[2]
    return load_attention_kernel(heads // kv_heads, q.shape[2], block_size)


def _token_attention(kernel: AttentionKernel, q: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata,
                     scale: float) -> torch.Tensor:
    """Every query token over its sequence's cached keys, one token per row: q [T, heads, d] -> same."""
    if not meta.num_prefill_tokens:
        return kernel(q, *kv_cache, meta.decode_block_tables, meta.decode_context_lens, scale)
    prefill = meta.num_prefill_tokens
    out = q.new_empty(q.shape)
    kernel(q[:prefill], *kv_cache, meta.prefill_block_tables, meta.prefill_token_lens, scale,
           meta.prefill_token_tables, out[:prefill])
    if meta.num_decodes:
        kernel(q[prefill:], *kv_cache, meta.decode_block_tables, meta.decode_context_lens, scale, None, out[prefill:])
    return out


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: PrefillGroup,
                      scale: float) -> torch.Tensor:
    """Equal-length sequences attending causally to themselves: [n * len, heads, d] -> same."""
    n, length = group.num_seqs, group.query_len
    q, k, v = (x.view(n, length, x.shape[1], x.shape[2]).transpose(1, 2) for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    return out.transpose(1, 2).reshape(n * length, -1, out.shape[-1])


def _context_attention(q: torch.Tensor, kv_cache: KVCache, seq: PrefillSequence, scale: float) -> torch.Tensor:
    """A chunk of queries after cached context: q [len, heads, d] over the sequence's cached keys."""
    keys, values = (cache.index_select(1, seq.block_table).flatten(1, 2)[:, :seq.context_len].unsqueeze(0)
                    for cache in kv_cache)  # [1, kvh, context, d]
    offset = seq.context_len - seq.query_len
    query_pos = torch.arange(seq.query_len, device=q.device).unsqueeze(1) + offset
    mask = torch.arange(seq.context_len, device=q.device).unsqueeze(0) <= query_pos
    out = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), keys, values, attn_mask=mask, scale=scale,
                                         enable_gqa=True)
    return out.squeeze(0).transpose(0, 1)


def _gathered_decode_attention(q: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata,
                               scale: float) -> torch.Tensor:
    """Decode attention in PyTorch over a gathered copy of each sequence's blocks.

    The heads sharing a KV head are treated as that head's query rows, so grouped-query attention needs no
    repeated keys: scores [kvh, B, group, L] come from one batched matmul over the gathered blocks."""
    batch, heads, dim = q.shape
    kv_heads = kv_cache[0].shape[0]
    keys, values = (cache.index_select(1, meta.decode_block_tables.flatten()).view(kv_heads, batch, -1, dim)
                    for cache in kv_cache)  # [kvh, B, L, d]
    q = (q * scale).view(batch, kv_heads, heads // kv_heads, dim).transpose(0, 1)
    scores = torch.matmul(q, keys.transpose(-1, -2))
    hidden = torch.arange(keys.shape[2], device=q.device) >= meta.decode_context_lens.unsqueeze(1)
    scores.masked_fill_(hidden.view(1, batch, 1, -1), float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), values)  # [kvh, B, group, d]
    return out.transpose(0, 1).reshape(batch, heads, dim)
