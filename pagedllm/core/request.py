"""The state of one request inside the engine: its tokens, how many are computed, its blocks, its status."""
from __future__ import annotations

import enum
from typing import Any, Mapping, Optional

from pagedllm.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()  # by recompute: back in the waiting queue
    SWAPPED = enum.auto()  # preempted by swapping its blocks to host memory
    # Everything from here on is finished.
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()  # the prompt can never fit in the KV cache
    FINISHED_ERROR = enum.auto()  # something of its own failed while its batch ran (its stop_reason says what)

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> Optional[str]:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_IGNORED: "length",
    RequestStatus.FINISHED_ERROR: "error",
}


class TokenCounts:
    """The counts of a request's token lists, for the scheduler's Request and the workers' copy of it."""

    prompt_token_ids: list[int]
    output_token_ids: list[int]
    all_token_ids: list[int]

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)


class Request(TokenCounts):
    """A request's tokens (prompt then outputs) of which the first `num_computed_tokens` have K/V in
    the cache, in the blocks of `block_ids`; each step the scheduler assigns some of the rest."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                 arrival_time: float, eos_token_id: Optional[int] = None, priority: int = 0,
                 lora_request: Any = None, prompt_embeds: Any = None,
                 trace_headers: Optional[Mapping[str, str]] = None) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = sampling_params
        self.arrival_time = arrival_time
        self.eos_token_id = eos_token_id
        self.priority = priority
        self.lora_request = lora_request
        self.prompt_embeds = prompt_embeds
        self.trace_headers = trace_headers  # W3C trace context to parent the request's span on
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache at first scheduling
        self.block_ids: list[int] = []
        self.block_hashes: list[int] = []  # chain hashes of its full blocks, filled by the prefix cache
        self.status = RequestStatus.WAITING
        # What the workers hold of it (scheduler_output.py): none while 0, else this many tokens and blocks.
        self.num_tokens_sent = 0
        self.num_blocks_sent = 0
        self.stop_reason: Any = None

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, tokens={self.num_tokens}, computed={self.num_computed_tokens}, "
                f"blocks={self.block_ids}, status={self.status.name})")
