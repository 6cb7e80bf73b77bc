"""The scheduler's decisions step by step, with a stand-in for the model that samples token 1."""
from __future__ import annotations

import itertools
from typing import Optional

from pagedllm.config import SchedulerConfig
from pagedllm.core.kv_cache import KVCacheManager
from pagedllm.core.request import Request, RequestStatus
from pagedllm.core.scheduler import Scheduler
from pagedllm.core.scheduler_output import SchedulerOutput
from pagedllm.sampling_params import SamplingParams

_clock = itertools.count()


def make_scheduler(num_blocks: int = 64, budget: int = 64, chunked: bool = False, max_num_seqs: int = 8,
                   mode: Optional[str] = None, policy: str = "fcfs", caching: bool = False,
                   num_swap_blocks: int = 0) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=1024,
                             enable_chunked_prefill=chunked, preemption_mode=mode, policy=policy,
                             num_scheduler_steps=1, watermark=0)
    return Scheduler(config, KVCacheManager(num_blocks, 4, 0, enable_caching=caching,
                                            num_swap_blocks=num_swap_blocks))


def add(scheduler: Scheduler, name: str, prompt_len: int, max_tokens: int = 4, priority: int = 0,
        first_token: int = 0) -> Request:
    request = Request(name, list(range(first_token, first_token + prompt_len)), SamplingParams(max_tokens=max_tokens),
                      arrival_time=float(next(_clock)), priority=priority)
    scheduler.add_request(request)
    return request


def step(scheduler: Scheduler) -> SchedulerOutput:
    """One step: every request whose tokens are all computed samples token 1; done at max_tokens."""
    out = scheduler.schedule()
    scheduled = [(scheduler.requests[rid], n) for rid, n in out.num_scheduled_tokens.items()]
    sampled = {r.request_id: [1] for r, n in scheduled if r.num_computed_tokens + n == r.num_tokens}
    scheduler.update_from_output(out, sampled)
    done = [r.request_id for r, _ in scheduled if r.num_output_tokens >= r.sampling_params.max_tokens]
    scheduler.finish_requests(done, RequestStatus.FINISHED_LENGTH_CAPPED)
    return out


def plan(out: SchedulerOutput) -> list[tuple[str, int]]:
    return list(out.num_scheduled_tokens.items())


def test_chunked_prefill_runs_decodes_first_then_chunks_within_the_budget():
    scheduler = make_scheduler(budget=8, chunked=True)
    add(scheduler, "a", 6)
    assert plan(step(scheduler)) == [("a", 6)]
    add(scheduler, "b", 20)
    assert plan(step(scheduler)) == [("a", 1), ("b", 7)]
    assert plan(step(scheduler)) == [("a", 1), ("b", 7)]
    assert plan(step(scheduler)) == [("a", 1), ("b", 6)]
    assert plan(step(scheduler)) == [("b", 1)]  # a finished after 4 tokens


def test_without_chunking_a_prompt_waits_for_a_step_with_room():
    scheduler = make_scheduler(budget=8)
    add(scheduler, "a", 6)
    add(scheduler, "b", 7)
    assert plan(step(scheduler)) == [("a", 6)]
    assert plan(step(scheduler)) == [("a", 1), ("b", 7)]


def test_recompute_preempts_the_newest_and_requeues_it_first():
    scheduler = make_scheduler(num_blocks=4)
    a, b = add(scheduler, "a", 8), add(scheduler, "b", 8)
    assert plan(step(scheduler)) == [("a", 8), ("b", 8)]
    add(scheduler, "c", 2)
    out = step(scheduler)  # a needs its third block
    assert plan(out) == [("a", 1)] and out.preempted_req_ids == ["b"]
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0 and b.block_ids == []
    assert [r.request_id for r in scheduler.waiting] == ["b", "c"]
    assert scheduler.num_preemptions == 1
    while a.status == RequestStatus.RUNNING:
        step(scheduler)
    assert plan(step(scheduler)) == [("b", 9), ("c", 2)]  # prompt and its sampled token, recomputed


def test_swap_moves_blocks_out_and_back_in_separate_steps():
    scheduler = make_scheduler(num_blocks=4, mode="swap", num_swap_blocks=8)
    add(scheduler, "a", 8)
    b = add(scheduler, "b", 8)
    step(scheduler)
    b_blocks = list(b.block_ids)
    out = step(scheduler)
    assert out.preempted_req_ids == ["b"] and b.status == RequestStatus.SWAPPED
    assert [device for device, _ in out.blocks_to_swap_out] == b_blocks and not out.blocks_to_swap_in
    assert b.num_computed_tokens == 8 and list(scheduler.swapped) == [b]
    add(scheduler, "c", 2)
    outs = [step(scheduler) for _ in range(4)]
    swap_in = next(o for o in outs if o.blocks_to_swap_in)
    assert not swap_in.blocks_to_swap_out and ("b", 1) in plan(swap_in)
    assert [host for host, _ in swap_in.blocks_to_swap_in] == [host for _, host in out.blocks_to_swap_out]
    # While b was swapped out, the waiting c was never admitted ahead of it.
    assert all(("c", 2) not in plan(o) for o in outs[:outs.index(swap_in)])


def test_swap_space_too_small_falls_back_to_recompute():
    scheduler = make_scheduler(num_blocks=4, mode="swap", num_swap_blocks=1)
    add(scheduler, "a", 8)
    b = add(scheduler, "b", 8)
    step(scheduler)
    out = step(scheduler)
    assert out.preempted_req_ids == ["b"] and b.status == RequestStatus.PREEMPTED and not out.blocks_to_swap_out


def test_a_request_that_can_never_fit_is_ignored_wherever_it_waits():
    scheduler = make_scheduler(num_blocks=4, budget=64, mode="swap", num_swap_blocks=8)
    big = add(scheduler, "big", 17)
    assert step(scheduler).finished_req_ids == {"big"} and big.status == RequestStatus.FINISHED_IGNORED
    grower = add(scheduler, "grower", 15, max_tokens=10)
    outs = [step(scheduler) for _ in range(4)]
    assert grower.status == RequestStatus.FINISHED_IGNORED and any("grower" in o.finished_req_ids for o in outs)
    assert scheduler.kv_cache.num_free_blocks == 4 and scheduler.kv_cache.num_free_swap_blocks == 8
    assert not scheduler.has_unfinished_requests()


def test_priority_orders_waiting_requests_then_by_arrival():
    scheduler = make_scheduler(budget=8, policy="priority", max_num_seqs=1)
    for name, priority in [("a", 2), ("b", 1), ("c", 2), ("d", 0)]:
        add(scheduler, name, 3, max_tokens=1, priority=priority)
    assert [plan(step(scheduler))[0][0] for _ in range(4)] == ["d", "b", "a", "c"]


def test_priority_preempts_a_worse_running_request_for_a_better_one():
    scheduler = make_scheduler(num_blocks=4, policy="priority")
    low = add(scheduler, "low", 12, max_tokens=8, priority=5)
    step(scheduler)
    add(scheduler, "high", 8, priority=0)
    out = step(scheduler)
    assert out.preempted_req_ids == ["low"] and plan(out) == [("high", 8)]
    assert list(scheduler.waiting) == [low]
    equal = make_scheduler(num_blocks=4, policy="priority")
    add(equal, "first", 12, max_tokens=8, priority=1)
    step(equal)
    add(equal, "second", 8, priority=1)
    assert not step(equal).preempted_req_ids


def test_prefix_hits_count_as_computed_and_are_reported_once():
    scheduler = make_scheduler(caching=True)
    add(scheduler, "a", 10, max_tokens=1)
    step(scheduler)
    b = add(scheduler, "b", 10, max_tokens=2)
    assert plan(step(scheduler)) == [("b", 2)] and b.num_cached_tokens == 8
    # Two identical prompts admitted in one step share blocks from that very step.
    c, d = add(scheduler, "c", 9, first_token=50), add(scheduler, "d", 9, first_token=50)
    assert plan(step(scheduler))[-2:] == [("c", 9), ("d", 1)] and d.block_ids[:2] == c.block_ids[:2]
    assert scheduler.kv_cache.prefix_cache_stats.hits == 16


def test_recompute_on_a_cache_too_small_for_the_load_takes_no_more_steps_than_swap():
    """50 requests on a cache that holds about one: recompute preemption must not thrash (a readmitted
    request evicted again before it makes progress); it finishes every request in the steps swap needs."""
    steps = {}
    for mode in ("swap", "recompute"):
        scheduler = make_scheduler(num_blocks=16, budget=256, max_num_seqs=64, mode=mode, caching=True,
                                   num_swap_blocks=1000 if mode == "swap" else 0)
        requests = [add(scheduler, str(i), 3, max_tokens=40, first_token=100 * i) for i in range(50)]
        steps[mode] = 0
        while scheduler.has_unfinished_requests() and steps[mode] < 20_000:
            step(scheduler)
            steps[mode] += 1
        assert all(r.num_output_tokens == 40 for r in requests)
        assert scheduler.num_preemptions > 0
    assert steps["recompute"] <= 1.1 * steps["swap"], steps
