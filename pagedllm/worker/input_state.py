"""The workers' own copy of each running request, kept up to date from each step's SchedulerOutput."""
from __future__ import annotations

from typing import Any, Optional

from pagedllm.core.request import TokenCounts
from pagedllm.core.scheduler_output import NewRequestData, SchedulerOutput
from pagedllm.sampling_params import SamplingParams


class WorkerRequest(TokenCounts):
    """What a worker knows of a request: its tokens, blocks and computed count (the names the batch layout
    and the sampler read, as on the engine's Request)."""

    def __init__(self, data: NewRequestData) -> None:
        self.request_id = data.request_id
        self.prompt_token_ids: list[int] = data.prompt_token_ids
        self.output_token_ids: list[int] = data.output_token_ids
        self.all_token_ids: list[int] = data.prompt_token_ids + data.output_token_ids
        self.sampling_params: SamplingParams = data.sampling_params
        self.eos_token_id: Optional[int] = data.eos_token_id
        self.block_ids: list[int] = data.block_ids
        self.num_computed_tokens = data.num_computed_tokens
        self.lora_request: Any = data.lora_request
        self.spec_token_ids: list[int] = []  # proposed tokens verified after its last one this step
        self.prompt_embeds: Any = data.prompt_embeds  # [prompt len, hidden] tensor, or None


class InputState:
    """The requests one worker holds, by id."""

    def __init__(self) -> None:
        self.requests: dict[str, WorkerRequest] = {}

    def update(self, output: SchedulerOutput) -> list[tuple[WorkerRequest, int]]:
        """Apply a step's changes; return its scheduled requests with their token counts, in order."""
        for request_id in [*output.finished_req_ids, *output.preempted_req_ids]:
            self.requests.pop(request_id, None)
        for data in output.new_requests:
            self.requests[data.request_id] = WorkerRequest(data)
        for change in output.cached_requests:
            request = self.requests[change.request_id]
            request.output_token_ids.extend(change.new_token_ids)
            request.all_token_ids.extend(change.new_token_ids)
            del request.block_ids[change.num_kept_blocks:]
            request.block_ids.extend(change.new_block_ids)
            request.num_computed_tokens = change.num_computed_tokens
        for request_id in output.num_scheduled_tokens:
            self.requests[request_id].spec_token_ids = output.scheduled_spec_tokens.get(request_id, [])
        return [(self.requests[rid], n) for rid, n in output.num_scheduled_tokens.items()]
