"""The sampling parameters of one step's sampling rows, gathered into tensors once per step."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from pagedllm.core.request import Request
from pagedllm.sampling_params import SamplingType


@dataclass
class SamplingMetadata:
    """Row i describes the i-th request that samples this step; a filter is None when no row uses it."""

    temperature: torch.Tensor  # [N] float, 1.0 on greedy rows
    greedy: torch.Tensor  # [N] bool
    all_greedy: bool
    top_k: Optional[torch.Tensor]  # [N] long, vocab size where off
    top_p: Optional[torch.Tensor]  # [N] float
    min_p: Optional[torch.Tensor]  # [N] float
    generators: dict[int, torch.Generator]  # row -> the request's own generator when seeded
    max_num_logprobs: Optional[int]
    # (row, token ids) that may not be sampled yet because min_tokens is not reached.
    min_tokens_blocked: list[tuple[int, list[int]]]

    @classmethod
    def build(cls, requests: list[Request], generators: dict[str, torch.Generator], vocab_size: int,
              device: torch.device) -> "SamplingMetadata":
        params = [r.sampling_params for r in requests]
        greedy = [p.sampling_type == SamplingType.GREEDY for p in params]
        top_k = [p.top_k if p.top_k > 0 else vocab_size for p in params]
        logprobs = [p.logprobs for p in params if p.logprobs is not None]
        blocked = [(i, sorted(_stop_ids(r))) for i, r in enumerate(requests)
                   if r.num_output_tokens < r.sampling_params.min_tokens]

        def tensor(values: list, dtype: torch.dtype, unused: object) -> Optional[torch.Tensor]:
            return None if all(v == unused for v in values) else torch.tensor(values, dtype=dtype, device=device)

        return cls(
            temperature=torch.tensor([1.0 if g else p.temperature for g, p in zip(greedy, params)],
                                     dtype=torch.float32, device=device),
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            all_greedy=all(greedy),
            top_k=tensor(top_k, torch.long, vocab_size),
            top_p=tensor([p.top_p for p in params], torch.float32, 1.0),
            min_p=tensor([p.min_p for p in params], torch.float32, 0.0),
            generators={i: generators[r.request_id] for i, r in enumerate(requests)
                        if r.request_id in generators},
            max_num_logprobs=max(logprobs) if logprobs else None,
            min_tokens_blocked=[(i, ids) for i, ids in blocked if ids],
        )


def _stop_ids(request: Request) -> set[int]:
    params = request.sampling_params
    ids = set(params.all_stop_token_ids)
    if request.eos_token_id is not None and not params.ignore_eos:
        ids.add(request.eos_token_id)
    return ids
