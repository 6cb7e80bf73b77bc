"""Laying out one step's scheduled tokens as flat model inputs and attention metadata."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from pagedllm.device_tensor import device_tensor
from pagedllm.model.attention import AttentionMetadata, PrefillGroup, PrefillSequence
from pagedllm.worker.input_state import WorkerRequest


@dataclass
class ModelInput:
    input_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    attn_metadata: AttentionMetadata
    requests: list[WorkerRequest]  # in layout order: prefill runs first, then decodes
    num_new_tokens: list[int]
    query_starts: list[int]
    sample_rows: list[int]  # index into `requests` of those whose last token is computed this step
    # [S] flat token index of each sampling row's last token; a row verifying proposed tokens has one index
    # per proposed token before it (its positions in order).
    sample_token_indices: torch.Tensor
    # Prompt positions given as embeddings: flat token rows [R] and their embeddings [R, hidden]; None if none.
    prompt_embeds: Optional[tuple[torch.Tensor, torch.Tensor]] = None


def cache_slot(block_ids: list[int], position: int, block_size: int) -> int:
    """The KV cache slot of a sequence's token at `position`, given the sequence's blocks."""
    return block_ids[position // block_size] * block_size + position % block_size


def _is_decode(request: WorkerRequest, n: int) -> bool:
    """A request's last token, and any proposed tokens after it: each is a decode row of its own over the
    request's blocks (attending to the keys up to its position), so verification runs the decode kernel."""
    return n == 1 + len(request.spec_token_ids) and request.num_computed_tokens > 0 or n == 1


def build_model_input(scheduled: list[tuple[WorkerRequest, int]], block_size: int, device: torch.device) -> ModelInput:
    """Prefills first (those without cached context grouped by length, so that equal lengths share one
    attention call), then decodes."""
    decodes = [(r, n) for r, n in scheduled if _is_decode(r, n)]
    fresh = sorted(((r, n) for r, n in scheduled if not _is_decode(r, n) and r.num_computed_tokens == 0),
                   key=lambda x: x[1])
    with_context = [(r, n) for r, n in scheduled if not _is_decode(r, n) and r.num_computed_tokens > 0]
    ordered = fresh + with_context + decodes
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_starts: list[int] = []
    for request, n in ordered:
        begin = request.num_computed_tokens
        query_starts.append(len(ids))
        tokens = request.all_token_ids[begin:begin + n]
        ids.extend(tokens + request.spec_token_ids[:n - len(tokens)])
        positions.extend(range(begin, begin + n))
        table = request.block_ids
        slots.extend(cache_slot(table, p, block_size) for p in range(begin, begin + n))
    decode_rows = [(r, r.num_computed_tokens + j + 1) for r, n in decodes for j in range(n)]
    num_prefill_tokens = len(ids) - len(decode_rows)
    block_tables = _block_tables([r for r, _ in decode_rows])
    sample_rows = [i for i, (r, n) in enumerate(ordered)
                   if r.num_computed_tokens + n == r.num_tokens + len(r.spec_token_ids)]
    meta = AttentionMetadata(
        slot_mapping=device_tensor(slots, torch.long, device),
        prefill_groups=_group_by_length(fresh),
        prefills=[PrefillSequence(query_starts[len(fresh) + i], n, r.num_computed_tokens + n,
                                  device_tensor(r.block_ids, torch.long, device))
                  for i, (r, n) in enumerate(with_context)],
        num_prefill_tokens=num_prefill_tokens, decode_block_tables=device_tensor(block_tables, torch.long, device),
        decode_context_lens=device_tensor([length for _, length in decode_rows], torch.long, device))
    prefills = fresh + with_context
    if prefills:  # a step of decodes alone leaves these unset: three tensors fewer to make each decode step
        meta.prefill_block_tables = device_tensor(_block_tables([r for r, _ in prefills]), torch.long, device)
        # Per prefill token: its sequence's row in the prefill block tables and the keys it attends to.
        meta.prefill_token_tables = device_tensor([i for i, (_, n) in enumerate(prefills) for _ in range(n)],
                                                  torch.long, device)
        meta.prefill_token_lens = device_tensor([p + 1 for p in positions[:num_prefill_tokens]], torch.long, device)
    return ModelInput(
        input_ids=device_tensor(ids, torch.long, device),
        positions=device_tensor(positions, torch.long, device),
        attn_metadata=meta, requests=[r for r, _ in ordered], num_new_tokens=[n for _, n in ordered],
        query_starts=query_starts, sample_rows=sample_rows,
        sample_token_indices=device_tensor(
            [query_starts[i] + ordered[i][1] - 1 - j for i in sample_rows
             for j in range(len(ordered[i][0].spec_token_ids), -1, -1)], torch.long, device),
        prompt_embeds=_prompt_embeds(ordered, query_starts, device))


def _prompt_embeds(ordered: list[tuple[WorkerRequest, int]], query_starts: list[int], device: torch.device
                   ) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """The flat rows of this step's prompt positions that come as embeddings, and those embeddings."""
    rows, values = [], []
    for (request, n), start in zip(ordered, query_starts):
        if request.prompt_embeds is None:
            continue
        begin = request.num_computed_tokens
        end = min(begin + n, request.num_prompt_tokens)
        if end > begin:
            rows.extend(range(start, start + end - begin))
            values.append(request.prompt_embeds[begin:end])
    if not rows:
        return None
    return device_tensor(rows, torch.long, device), torch.cat(values).to(device)


def _group_by_length(prefills: list[tuple[WorkerRequest, int]]) -> list[PrefillGroup]:
    """Runs of equal query length among prefills laid out one after another."""
    groups: list[PrefillGroup] = []
    start = 0
    for _, n in prefills:
        if groups and groups[-1].query_len == n:
            groups[-1].num_seqs += 1
        else:
            groups.append(PrefillGroup(start, 1, n))
        start += n
    return groups


def _block_tables(requests: list[WorkerRequest]) -> torch.Tensor:
    """Each request's block ids, padded to the longest table with its own first block (so that every block
    read is one of its own and holds finite values)."""
    if not requests:
        return torch.zeros((0, 1), dtype=torch.long)
    width = max(len(r.block_ids) for r in requests)
    return torch.tensor([r.block_ids + r.block_ids[:1] * (width - len(r.block_ids)) for r in requests],
                        dtype=torch.long)
