"""Multi-step decoding in the engine: vLLM's refusals per request, and each token's outputs handed out one
engine step at a time.

The worker returns a multi-step group's tokens together (worker/multi_step.py); the engine checks them one at
a time like speculative decoding's accepted tokens. With `multi_step_stream_outputs` (vLLM's default) it makes
an output after each of them and, as vLLM's steps do, `step()` returns the first token's outputs and each
later call the next token's, before anything is scheduled again. Without it, each group reports once.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Iterable

from pagedllm.config import SchedulerConfig
from pagedllm.outputs import RequestOutput
from pagedllm.sampling_params import SamplingParams


def check_multi_step_params(params: Any, config: SchedulerConfig) -> None:
    """A request that multi-step decoding cannot honour is refused, as vLLM refuses it: a grammar mask or a
    logits processor needs the logits of each token before the next is sampled, on the engine's side."""
    if not config.is_multi_step or not isinstance(params, SamplingParams):
        return
    for name in ("guided_decoding", "logits_processors"):
        if getattr(params, name):
            raise ValueError(f"Guided decoding and logits processors are not supported in multi-step decoding: "
                             f"this request sets {name}, and num_scheduler_steps is {config.num_scheduler_steps}.")


class StreamedTokens:
    """The outputs of a group's later tokens, waiting for the `step()` calls that return them."""

    def __init__(self) -> None:
        self._batches: deque[list[RequestOutput]] = deque()

    def __bool__(self) -> bool:
        return bool(self._batches)

    def first(self, batches: list[list[RequestOutput]]) -> list[RequestOutput]:
        """Keep the outputs of every token after the first; return the first's."""
        self._batches.extend(batches[1:])
        return batches[0] if batches else []

    def next(self) -> list[RequestOutput]:
        return self._batches.popleft()

    def drop(self, request_ids: Iterable[str]) -> None:
        """Aborted requests report nothing more."""
        ids = set(request_ids)
        for batch in self._batches:
            batch[:] = [output for output in batch if output.request_id not in ids]
