"""What the scheduler sends the workers: a request whole once, then only its changes; plain data."""
from __future__ import annotations

import pickle

from pagedllm.config import SchedulerConfig
from pagedllm.core.kv_cache import KVCacheManager
from pagedllm.core.request import Request
from pagedllm.core.scheduler import Scheduler
from pagedllm.sampling_params import SamplingParams


def make_scheduler(num_blocks: int) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64,
                             enable_chunked_prefill=False, preemption_mode=None, policy="fcfs",
                             num_scheduler_steps=1, watermark=0)
    return Scheduler(config, KVCacheManager(num_blocks, 4, 0))


def test_a_request_is_sent_whole_once_then_as_changes_and_whole_again_after_preemption():
    scheduler = make_scheduler(num_blocks=3)
    scheduler.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=8), 0.0))
    first = scheduler.schedule()
    assert [(r.request_id, r.prompt_token_ids, r.output_token_ids, r.block_ids, r.num_computed_tokens)
            for r in first.new_requests] == [("a", [1, 2, 3], [], [0], 0)]
    assert not first.cached_requests and first.num_scheduled_tokens == {"a": 3}
    scheduler.update_from_output(first, {"a": [9]})
    second = scheduler.schedule()  # token 4 of "a" still fits its first block
    assert not second.new_requests
    assert [(c.request_id, c.new_token_ids, c.new_block_ids, c.num_computed_tokens)
            for c in second.cached_requests] == [("a", [9], [], 3)]
    scheduler.update_from_output(second, {"a": [8]})
    third = scheduler.schedule()  # token 5 needs a new block
    assert [(c.new_token_ids, c.new_block_ids, c.num_computed_tokens) for c in third.cached_requests] == [([8], [1], 4)]
    scheduler.update_from_output(third, {"a": [7]})
    scheduler.add_request(Request("b", [5, 6, 7, 8, 9], SamplingParams(max_tokens=8), 1.0))
    fourth = scheduler.schedule()  # "b" needs two blocks: only one is free; "a" (running) keeps its own
    assert fourth.num_scheduled_tokens == {"a": 1}
    scheduler.update_from_output(fourth, {"a": [6]})
    scheduler.finish_requests(["a"], scheduler.requests["a"].status.FINISHED_ABORTED)
    fifth = scheduler.schedule()
    assert fifth.finished_req_ids == {"a"} and [r.request_id for r in fifth.new_requests] == ["b"]


def test_preempted_requests_are_named_and_resent_whole_with_their_outputs():
    scheduler = make_scheduler(num_blocks=2)
    for name, arrival in (("a", 0.0), ("b", 1.0)):
        scheduler.add_request(Request(name, [1, 2, 3, 4], SamplingParams(max_tokens=8), arrival))
    out = scheduler.schedule()
    scheduler.update_from_output(out, {"a": [5], "b": [5]})
    out = scheduler.schedule()  # each needs a second block: the newest is preempted
    assert out.preempted_req_ids == ["b"] and list(out.num_scheduled_tokens) == ["a"]
    scheduler.finish_requests(["a"], scheduler.requests["a"].status.FINISHED_STOPPED)
    out = scheduler.schedule()
    assert [(r.request_id, r.output_token_ids, r.num_computed_tokens) for r in out.new_requests] == [("b", [5], 0)]
    assert out.num_scheduled_tokens == {"b": 5}


def test_the_scheduler_output_and_the_runner_output_survive_pickling():
    from pagedllm.core.runner_output import ModelRunnerOutput, TokenLogprobs

    scheduler = make_scheduler(num_blocks=4)
    scheduler.add_request(Request("a", [1, 2, 3], SamplingParams(temperature=0.5, seed=3), 0.0))
    out = pickle.loads(pickle.dumps(scheduler.schedule()))
    assert out.new_requests[0].sampling_params.seed == 3 and out.num_scheduled_tokens == {"a": 3}
    result = ModelRunnerOutput({"a": [7]}, {"a": TokenLogprobs([[7, 8]], [[-0.1, -2.5]], [1])}, {}, 1.5)
    assert pickle.loads(pickle.dumps(result)) == result
