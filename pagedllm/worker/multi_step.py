"""Multi-step decoding on the worker: several tokens per request from one scheduling decision.

The scheduler hands a step of decodes only with each request's number of tokens (`decode_steps`). The worker
runs that many forward passes, each over the requests that still want a token, feeding every sampled token
back as the next pass's input (so each pass is an ordinary decode step and replays its CPU graph). The tokens
return as one list per request, the shape speculative decoding's accepted tokens take, and the engine checks
them one at a time. The worker's copies are then put back as the scheduler sent them: the scheduler appends
the tokens itself and sends them with the request's next step, as it does for every sampled token.
"""
from __future__ import annotations

from typing import Callable

from pagedllm.core.runner_output import ModelRunnerOutput, TokenLogprobs
from pagedllm.worker.input_state import WorkerRequest

RunPass = Callable[[list[tuple[WorkerRequest, int]]], ModelRunnerOutput]


def run_decode_steps(run_pass: RunPass, requests: list[WorkerRequest], decode_steps: dict[str, int]
                     ) -> ModelRunnerOutput:
    """Sample up to `decode_steps[id]` tokens for each request, one `run_pass` (forward and sample) at a
    time; a request that fails stops there (its failure is reported with the tokens it sampled before)."""
    sampled: dict[str, list[int]] = {}
    logprobs: dict[str, TokenLogprobs] = {}
    failed: dict[str, str] = {}
    forward_ms = 0.0
    active = list(requests)
    try:
        while active:
            output = run_pass([(request, 1) for request in active])
            forward_ms += output.model_forward_time
            failed.update(output.failed)
            for request in active:
                tokens = output.sampled_token_ids.get(request.request_id)
                if tokens:
                    _feed_back(request, tokens[0])
                    sampled.setdefault(request.request_id, []).append(tokens[0])
                    _extend(logprobs, request.request_id, output.logprobs.get(request.request_id))
            active = [r for r in active if r.request_id in output.sampled_token_ids
                      and len(sampled[r.request_id]) < decode_steps.get(r.request_id, 1)]
    finally:
        for request in requests:
            _take_back(request, len(sampled.get(request.request_id, ())))
    return ModelRunnerOutput(sampled, logprobs, {}, forward_ms, failed=failed)


def _feed_back(request: WorkerRequest, token: int) -> None:
    """The sampled token becomes the request's last, the one before it computed."""
    request.output_token_ids.append(token)
    request.all_token_ids.append(token)
    request.num_computed_tokens += 1


def _take_back(request: WorkerRequest, num_tokens: int) -> None:
    if num_tokens:
        del request.output_token_ids[-num_tokens:]
        del request.all_token_ids[-num_tokens:]
        request.num_computed_tokens -= num_tokens


def _extend(logprobs: dict[str, TokenLogprobs], request_id: str, entry: TokenLogprobs | None) -> None:
    if entry is None:
        return
    old = logprobs.get(request_id)
    logprobs[request_id] = entry if old is None else TokenLogprobs(
        old.token_ids + entry.token_ids, old.logprobs + entry.logprobs, old.ranks + entry.ranks)
