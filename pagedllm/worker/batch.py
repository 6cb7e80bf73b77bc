"""Laying out one step's scheduled tokens as flat model inputs and attention metadata."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedllm.core.request import Request
from pagedllm.model.attention import AttentionMetadata, PrefillSequence


@dataclass
class ModelInput:
    input_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    attn_metadata: AttentionMetadata
    requests: list[Request]  # in layout order: prefill runs first, then one-token decodes
    num_new_tokens: list[int]
    query_starts: list[int]
    sample_rows: list[int]  # index into `requests` of those whose last token is computed this step
    sample_token_indices: torch.Tensor  # [S] flat token index of each sampling row's last token


def build_model_input(scheduled: list[tuple[Request, int]], block_size: int, device: torch.device) -> ModelInput:
    prefills = [(r, n) for r, n in scheduled if n > 1]
    decodes = [(r, n) for r, n in scheduled if n == 1]
    ordered = prefills + decodes
    ids, positions, slots, seqs = [], [], [], []
    query_starts, start = [], 0
    for request, n in prefills:
        begin = request.num_computed_tokens
        ids.extend(request.all_token_ids[begin:begin + n])
        table = torch.tensor(request.block_ids, dtype=torch.long)
        pos = torch.arange(begin, begin + n)
        positions.append(pos)
        slots.append(table[pos // block_size] * block_size + pos % block_size)
        seqs.append(PrefillSequence(start, n, begin + n, table.to(device)))
        query_starts.append(start)
        start += n
    num_prefill_tokens = start
    tables, mask = _decode_tables([r for r, _ in decodes], block_size)
    if decodes:
        pos = torch.tensor([r.num_computed_tokens for r, _ in decodes])
        ids.extend(r.all_token_ids[r.num_computed_tokens] for r, _ in decodes)
        positions.append(pos)
        slots.append(tables[torch.arange(len(decodes)), pos // block_size] * block_size + pos % block_size)
        query_starts.extend(range(start, start + len(decodes)))
    sample_rows = [i for i, (r, n) in enumerate(ordered) if r.num_computed_tokens + n == r.num_tokens]
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slots).to(device), prefills=seqs, num_prefill_tokens=num_prefill_tokens,
        decode_block_tables=tables.to(device), decode_mask=mask.to(device))
    return ModelInput(
        input_ids=torch.tensor(ids, dtype=torch.long, device=device), positions=torch.cat(positions).to(device),
        attn_metadata=meta, requests=[r for r, _ in ordered], num_new_tokens=[n for _, n in ordered],
        query_starts=query_starts, sample_rows=sample_rows,
        sample_token_indices=torch.tensor([query_starts[i] + ordered[i][1] - 1 for i in sample_rows],
                                          dtype=torch.long, device=device))


def _decode_tables(requests: list[Request], block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block tables padded to the longest, and which key slots each decode may see."""
    width = max((len(r.block_ids) for r in requests), default=1)
    tables = torch.tensor([r.block_ids + [0] * (width - len(r.block_ids)) for r in requests],
                          dtype=torch.long).view(len(requests), width)
    context_lens = torch.tensor([r.num_computed_tokens + 1 for r in requests], dtype=torch.long)
    mask = torch.arange(width * block_size).unsqueeze(0) < context_lens.unsqueeze(1)
    return tables, mask.view(len(requests), 1, 1, width * block_size)
