"""What crosses from the scheduler to the workers each step: plain, picklable data.

Workers keep their own copy of each running request (worker/input_state.py). A request is sent whole once,
when it starts running (first scheduling, or resuming after preemption), and after that each step carries
only its changes: the tokens appended since the last step, the blocks added, the computed count.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from pagedllm.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    """A request the workers do not hold yet (or dropped when it was preempted): everything about it."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # non-empty when resuming after preemption
    sampling_params: SamplingParams
    eos_token_id: Optional[int]
    block_ids: list[int]
    num_computed_tokens: int
    lora_request: Any = None
    # A prompt given as embeddings [prompt len, hidden] (its prompt_token_ids are placeholders); sent with
    # the request whole, never with its changes.
    prompt_embeds: Any = None


@dataclass
class CachedRequestData:
    """A request the workers already hold: what changed since the step that last scheduled it."""

    request_id: str
    new_token_ids: list[int]  # tokens sampled since (appended to its outputs)
    new_block_ids: list[int]  # blocks appended to its block table since
    num_computed_tokens: int
    # How many leading blocks of its table stay before new_block_ids: fewer than the workers hold when blocks
    # past its tokens were freed (rejected proposals, lookahead).
    num_kept_blocks: int


@dataclass
class SchedulerOutput:
    """One step's plan; the workers need nothing else to run it."""

    # Request id -> number of its tokens computed this step, in scheduling order.
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    new_requests: list[NewRequestData] = field(default_factory=list)
    cached_requests: list[CachedRequestData] = field(default_factory=list)
    # Workers drop their copy of these: preempted (sent whole again on resuming), finished since the
    # previous step (aborted, stopped, or ignored because they never fit).
    preempted_req_ids: list[str] = field(default_factory=list)
    finished_req_ids: set[str] = field(default_factory=set)
    # Block copies to do before the forward pass: (device, host) out, (host, device) in. A step never
    # does both, so no block is read and written by the two directions.
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    # Guided requests that sample this step -> packed bitmasks [1 + its scheduled proposals, vocab/32] of the
    # tokens allowed at each position it samples (set by the engine).
    grammar_bitmasks: dict[str, Any] = field(default_factory=dict)
    # Which of the pipeline's virtual engines (and so which KV cache) this step belongs to.
    virtual_engine: int = 0
    # Speculative decoding: proposed tokens scheduled for verification after a request's last token (they are
    # among its num_scheduled_tokens), and how many tokens to propose for each request that samples.
    scheduled_spec_tokens: dict[str, list[int]] = field(default_factory=dict)
    num_lookahead_tokens: int = 0
    # Multi-step (num_scheduler_steps > 1): in a step of decodes only, request id -> how many tokens it samples,
    # one forward pass each, every token fed back as the next pass's input. Empty: one token each.
    decode_steps: dict[str, int] = field(default_factory=dict)

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        """No tokens to compute (there may still be swaps or ids to drop)."""
        return not self.num_scheduled_tokens

    @property
    def has_work_for_workers(self) -> bool:
        return bool(self.num_scheduled_tokens or self.blocks_to_swap_out or self.blocks_to_swap_in
                    or self.preempted_req_ids or self.finished_req_ids)
