"""Attention over a paged KV cache.

Each layer's cache is a pair of tensors [num_blocks, block_size, kv_heads, head_dim]; a request's tokens
live in the blocks its block table lists. One step's tokens are laid out prefill sequences first (each a
run of query tokens, possibly after already cached context), then decode tokens (one per request).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillSequence:
    query_start: int  # offset of its first query token in the step's flat token list
    query_len: int
    context_len: int  # tokens attended to, the query included
    block_table: torch.Tensor  # [num_blocks] long


@dataclass
class AttentionMetadata:
    """How one step's flat token list maps onto sequences and cache slots; built once per step."""

    slot_mapping: torch.Tensor  # [T] long: flat cache slot of each token's K/V
    prefills: list[PrefillSequence]
    num_prefill_tokens: int
    decode_block_tables: torch.Tensor  # [B, max_blocks] long, padded with block 0
    decode_mask: torch.Tensor  # [B, 1, 1, max_blocks * block_size] bool: True where a key is visible

    @property
    def num_decodes(self) -> int:
        return self.decode_block_tables.shape[0]


def write_kv(kv_cache: tuple[torch.Tensor, torch.Tensor], k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store this step's K/V [T, kv_heads, d] into their slots."""
    key_cache, value_cache = kv_cache
    key_cache.view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k)
    value_cache.view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
                    scale: float) -> torch.Tensor:
    """q [T, heads, d], k/v [T, kv_heads, d] of this step; returns [T, heads, d]."""
    write_kv(kv_cache, k, v, meta.slot_mapping)
    out = torch.empty_like(q)
    for seq in meta.prefills:
        rows = slice(seq.query_start, seq.query_start + seq.query_len)
        out[rows] = _prefill_attention(q[rows], k[rows], v[rows], kv_cache, seq, scale)
    if meta.num_decodes:
        out[meta.num_prefill_tokens:] = _decode_attention(q[meta.num_prefill_tokens:], kv_cache, meta, scale)
    return out


def _gather(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[..., num_blocks] block ids -> [..., kv_heads, num_blocks * block_size, d]."""
    blocks = cache[block_tables]  # [..., nb, bs, kvh, d]
    merged = blocks.flatten(-4, -3)  # [..., nb*bs, kvh, d]
    return merged.transpose(-3, -2)


def _prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       kv_cache: tuple[torch.Tensor, torch.Tensor], seq: PrefillSequence,
                       scale: float) -> torch.Tensor:
    q = q.transpose(0, 1).unsqueeze(0)  # [1, heads, q, d]
    if seq.context_len == seq.query_len:  # nothing cached before this chunk: causal over the chunk itself
        keys, values = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
        out = F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=scale, enable_gqa=True)
    else:
        keys = _gather(kv_cache[0], seq.block_table)[:, :seq.context_len].unsqueeze(0)
        values = _gather(kv_cache[1], seq.block_table)[:, :seq.context_len].unsqueeze(0)
        offset = seq.context_len - seq.query_len
        query_pos = torch.arange(seq.query_len, device=q.device).unsqueeze(1) + offset
        mask = torch.arange(seq.context_len, device=q.device).unsqueeze(0) <= query_pos
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.squeeze(0).transpose(0, 1)


def _decode_attention(q: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
                      scale: float) -> torch.Tensor:
    keys = _gather(kv_cache[0], meta.decode_block_tables)  # [B, kvh, L, d]
    values = _gather(kv_cache[1], meta.decode_block_tables)
    out = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=meta.decode_mask, scale=scale,
                                         enable_gqa=True)  # [B, heads, 1, d]
    return out.squeeze(2)
