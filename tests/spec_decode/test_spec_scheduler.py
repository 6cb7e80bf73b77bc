"""The scheduler with proposed tokens: k + 1 tokens scheduled, lookahead slots reserved, rejected tokens
taken back, only accepted tokens hashed for the prefix cache, proposals trimmed to what a request may emit."""
from __future__ import annotations

from pagedllm.config import SchedulerConfig
from pagedllm.core.kv_cache import KVCacheManager
from pagedllm.core.request import Request
from pagedllm.core.scheduler import Scheduler
from pagedllm.sampling_params import SamplingParams


def make_scheduler(num_blocks: int = 16, k: int = 3, lookahead: int = 0, disable_at=None,
                   caching: bool = False) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64,
                             enable_chunked_prefill=False, preemption_mode=None, policy="fcfs",
                             num_scheduler_steps=1, watermark=0, num_speculative_tokens=k,
                             num_lookahead_slots=lookahead, speculative_disable_by_batch_size=disable_at)
    return Scheduler(config, KVCacheManager(num_blocks, 4, 0, enable_caching=caching))


def prefill(scheduler: Scheduler, request: Request, drafts: list[int]) -> None:
    scheduler.add_request(request)
    out = scheduler.schedule()
    assert out.num_lookahead_tokens == scheduler.config.num_speculative_tokens
    scheduler.update_from_output(out, {request.request_id: [9]}, {request.request_id: drafts})


def test_proposals_are_verified_in_one_step_and_rejected_ones_taken_back():
    scheduler = make_scheduler()
    request = Request("a", [1, 2, 3], SamplingParams(max_tokens=20), 0.0)
    prefill(scheduler, request, [4, 5, 6])
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"a": 4} and out.scheduled_spec_tokens == {"a": [4, 5, 6]}
    assert out.cached_requests[0].new_token_ids == [9]  # the proposals travel apart from the tokens
    # One proposal kept, then the target's own token: 2 new tokens, positions 3 and 4 computed.
    scheduler.update_from_output(out, {"a": [4, 7]}, {"a": [8]})
    assert request.output_token_ids == [9, 4, 7]
    assert request.num_computed_tokens == 5 == request.num_tokens - 1
    assert request.spec_token_ids == [8]
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"a": 2} and out.cached_requests[0].new_token_ids == [4, 7]


def test_a_draft_model_gets_lookahead_slots_past_the_verified_tokens():
    scheduler = make_scheduler(lookahead=3)
    request = Request("a", [1, 2, 3], SamplingParams(max_tokens=20), 0.0)
    prefill(scheduler, request, [4, 5, 6])
    scheduler.schedule()  # verifies 4 tokens from position 3: up to position 6, plus 3 lookahead: 10 slots
    assert len(request.block_ids) == 3


def test_blocks_past_the_accepted_tokens_are_freed_and_workers_follow():
    from pagedllm.worker.input_state import InputState

    scheduler, worker = make_scheduler(lookahead=3), InputState()
    request = Request("a", [1, 2, 3], SamplingParams(max_tokens=20), 0.0)
    scheduler.add_request(request)
    steps = [([9], [4, 5, 6]), ([4, 7], [8, 8, 8]), ([1], [2, 3, 4]), ([2, 3, 4, 5], [6])]
    for sampled, drafts in steps:
        out = scheduler.schedule()
        worker.update(out)
        assert worker.requests["a"].block_ids == request.block_ids  # the workers' table follows, trimmed
        scheduler.update_from_output(out, {"a": sampled}, {"a": drafts})
        # Only the blocks the request's tokens need stay in use: the lookahead ones went back.
        needed = -(-request.num_tokens // 4)
        assert len(request.block_ids) == needed
        assert scheduler.kv_cache.num_blocks - scheduler.kv_cache.num_free_blocks == needed
    assert request.output_token_ids == [9, 4, 7, 1, 2, 3, 4, 5]


def test_proposals_are_trimmed_to_max_tokens_and_kept_for_guided_requests():
    from pagedllm.sampling_params import GuidedDecodingParams

    scheduler = make_scheduler()
    capped = Request("a", [1, 2, 3], SamplingParams(max_tokens=3), 0.0)
    guided = Request("b", [1, 2, 3], SamplingParams(max_tokens=9, guided_decoding=GuidedDecodingParams(
        choice=["x", "y"])), 0.0)
    scheduler.add_request(capped)
    scheduler.add_request(guided)
    out = scheduler.schedule()
    scheduler.update_from_output(out, {"a": [9], "b": [9]}, {"a": [4, 5, 6], "b": [4, 5, 6]})
    out = scheduler.schedule()
    # "a" may emit 2 more tokens: one proposal and the target's own. "b"'s grammar masks each verified position
    # (the engine cut its proposals to what the grammar accepts before they got here).
    assert out.scheduled_spec_tokens == {"a": [4], "b": [4, 5, 6]}
    assert out.num_scheduled_tokens == {"a": 2, "b": 4}


def test_speculation_stops_at_disable_by_batch_size():
    scheduler = make_scheduler(disable_at=2)
    for name in "ab":
        scheduler.add_request(Request(name, [1, 2, 3], SamplingParams(max_tokens=9), 0.0))
    out = scheduler.schedule()  # nothing ran before this step: speculation was on
    scheduler.update_from_output(out, {"a": [9], "b": [9]}, {"a": [4], "b": [4]})
    out = scheduler.schedule()
    assert out.num_lookahead_tokens == 0 and not out.scheduled_spec_tokens
    assert out.num_scheduled_tokens == {"a": 1, "b": 1}


def test_only_accepted_tokens_are_hashed_for_the_prefix_cache():
    scheduler = make_scheduler(k=4, caching=True)
    request = Request("a", [1, 2, 3], SamplingParams(max_tokens=20), 0.0)
    prefill(scheduler, request, [4, 5, 6, 7])
    out = scheduler.schedule()  # positions 3..7: block 1 fills up, but only with proposals
    assert len(request.block_hashes) == 1  # block 0: [1, 2, 3, 9]
    scheduler.update_from_output(out, {"a": [4, 8]}, {})
    scheduler.schedule()
    assert request.all_token_ids == [1, 2, 3, 9, 4, 8] and len(request.block_hashes) == 1
    assert request.num_computed_tokens == 5


def test_preemption_drops_the_proposals():
    scheduler = make_scheduler(num_blocks=3)
    first = Request("a", [1, 2, 3], SamplingParams(max_tokens=20), 0.0)
    second = Request("b", [1, 2, 3], SamplingParams(max_tokens=20), 1.0)
    scheduler.add_request(first)
    scheduler.add_request(second)
    out = scheduler.schedule()
    scheduler.update_from_output(out, {"a": [9], "b": [9]}, {"a": [4, 5, 6], "b": [4, 5, 6]})
    out = scheduler.schedule()  # each needs a second block; only one is free: "b" goes
    assert out.preempted_req_ids == ["b"] and second.spec_token_ids == [] and second.num_computed_tokens == 0
    assert out.scheduled_spec_tokens == {"a": [4, 5, 6]}
