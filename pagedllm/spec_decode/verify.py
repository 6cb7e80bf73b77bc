"""A step's sampling for requests that verify proposed tokens: every proposed position goes through the
sampler's steps as a row of its own (with the proposals before it counted as outputs, so penalties, min_tokens
and logits processors see what plain decoding would), then rejection.py decides what is kept. A request fails,
as in plain decoding, where a position it uses cannot be sampled (every token masked, or non-finite logits)."""
from __future__ import annotations

from typing import Iterator, Optional

import torch

from pagedllm.core.runner_output import TokenLogprobs
from pagedllm.sample.metadata import SamplingMetadata
from pagedllm.sample.sampler import gather_logprobs, process_logits, random_probs, row_max, unsampleable_rows
from pagedllm.sampling_params import SamplingParams, SamplingType
from pagedllm.spec_decode.rejection import accept_greedy, accept_sampled
from pagedllm.worker.input_state import WorkerRequest


class _PositionRow:
    """One verified position of a request, as sampling reads a request: its outputs include the proposed
    tokens before this position."""

    def __init__(self, request: WorkerRequest, num_proposed_before: int) -> None:
        self.request_id = request.request_id
        self.prompt_token_ids = request.prompt_token_ids
        self.output_token_ids = request.output_token_ids + request.spec_token_ids[:num_proposed_before]
        self.sampling_params: SamplingParams = request.sampling_params
        self.eos_token_id = request.eos_token_id

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)


def verify_proposals(logits: torch.Tensor, requests: list[WorkerRequest], generators: dict[str, torch.Generator],
                     vocab_size: int, device: torch.device, failed: dict[str, str],
                     grammar_bitmasks: Optional[dict] = None
                     ) -> tuple[dict[str, list[int]], dict[str, TokenLogprobs]]:
    """logits [sum of (proposed + 1) over requests, vocab], each request's positions in order -> the tokens
    each request emits and, where asked, their logprobs (one position per emitted token). `failed` holds the
    requests failed before sampling (id -> why); those that fail here are added to it, and emit the tokens
    before the position where they failed."""
    rows = [_PositionRow(r, j) for r in requests for j in range(len(r.spec_token_ids) + 1)]
    meta = SamplingMetadata.build(rows, generators, vocab_size, device, grammar_bitmasks)
    logits = process_logits(logits, meta)
    logprobs = torch.log_softmax(logits, dim=-1) if meta.max_num_logprobs is not None else None
    maxima, greedy = row_max(logits)
    greedy, unsampleable = greedy.tolist(), unsampleable_rows(maxima.tolist(), meta.failed)
    probs = None if meta.all_greedy else random_probs(logits, meta)
    sampled, sampled_logprobs = {}, {}
    for request, start, end in _position_spans(requests):
        if request.request_id in failed:
            continue
        proposed, params = request.spec_token_ids, request.sampling_params
        if params.sampling_type == SamplingType.GREEDY:
            tokens = accept_greedy(greedy[start:end], proposed)
        else:
            tokens = accept_sampled(probs[start:end], proposed, generators.get(request.request_id))
        tokens = _until_failure(request.request_id, tokens, start, unsampleable, failed)
        if not tokens:
            continue
        sampled[request.request_id] = tokens
        if logprobs is not None and params.logprobs is not None:
            ids, values, ranks = gather_logprobs(logprobs[start:start + len(tokens)],
                                                 torch.tensor(tokens, device=device), params.logprobs)
            sampled_logprobs[request.request_id] = TokenLogprobs(ids.tolist(), values.tolist(), ranks.tolist())
    return sampled, sampled_logprobs


def verify_greedy(argmax: list[int], maxima: list[float], requests: list[WorkerRequest],
                  failed: dict[str, str]) -> dict[str, list[int]]:
    """The tokens each greedy request emits, given the argmax and the largest logit of its every verified
    position, in order (from a CPU graph's greedy step: the requests take the argmax of their logits as they
    come). `failed` holds the requests failed before sampling; those that fail here are added to it, and emit
    the tokens before the position where they failed."""
    unsampleable = unsampleable_rows(maxima, {})
    sampled = {}
    for request, start, end in _position_spans(requests):
        if request.request_id in failed:
            continue
        tokens = accept_greedy(argmax[start:end], request.spec_token_ids)
        tokens = _until_failure(request.request_id, tokens, start, unsampleable, failed)
        if tokens:
            sampled[request.request_id] = tokens
    return sampled


def _until_failure(request_id: str, tokens: list[int], start: int, unsampleable: dict[int, str],
                   failed: dict[str, str]) -> list[int]:
    """The request's emitted tokens (from its positions start, start + 1, ...) before the first position that
    cannot be sampled; there it fails (added to `failed`), as plain decoding would at that token, and the engine
    finishes it with an error unless a token before it stopped it. Positions after its first rejected proposal
    are never used, as plain decoding never reaches them."""
    for i in range(len(tokens)):
        if start + i in unsampleable:
            failed[request_id] = unsampleable[start + i]
            return tokens[:i]
    return tokens


def _position_spans(requests: list[WorkerRequest]) -> Iterator[tuple[WorkerRequest, int, int]]:
    """Each request with the rows [start, end) of its verified positions (its proposals and one more), the
    requests' rows one after another."""
    start = 0
    for request in requests:
        end = start + len(request.spec_token_ids) + 1
        yield request, start, end
        start = end
