"""Multi-step scheduling without a model: which steps run several tokens, how many, and the slots reserved."""
from __future__ import annotations

from pagedllm.config import SchedulerConfig
from pagedllm.core.kv_cache import KVCacheManager
from pagedllm.core.request import Request
from pagedllm.core.scheduler import Scheduler
from pagedllm.sampling_params import SamplingParams

BLOCK_SIZE = 4


def make_scheduler(steps: int, num_blocks: int = 64, max_model_len: int = 1024) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=max_model_len,
                             enable_chunked_prefill=False, preemption_mode=None, policy="fcfs",
                             num_scheduler_steps=steps, watermark=0)
    return Scheduler(config, KVCacheManager(num_blocks, BLOCK_SIZE, 0))


def add(scheduler: Scheduler, name: str, prompt_len: int, max_tokens: int, arrival: float = 0.0) -> Request:
    request = Request(name, list(range(prompt_len)), SamplingParams(max_tokens=max_tokens), arrival_time=arrival)
    scheduler.add_request(request)
    return request


def run(scheduler: Scheduler):
    """One step whose every sampling request gets as many tokens (7) as its decode steps say."""
    out = scheduler.schedule()
    sampled = {rid: [7] * out.decode_steps.get(rid, 1) for rid, n in out.num_scheduled_tokens.items()
               if scheduler.requests[rid].num_computed_tokens + n == scheduler.requests[rid].num_tokens}
    scheduler.update_from_output(out, sampled)
    return out


def test_prefill_runs_once_then_decodes_run_in_groups_capped_by_max_tokens():
    scheduler = make_scheduler(steps=4)
    a, b = add(scheduler, "a", 6, max_tokens=10), add(scheduler, "b", 3, max_tokens=3, arrival=1.0)
    assert run(scheduler).decode_steps == {}  # the prefills
    out = run(scheduler)
    assert out.num_scheduled_tokens == {"a": 1, "b": 1}
    assert out.decode_steps == {"a": 4, "b": 2}  # b may emit only 2 more tokens
    assert (a.num_output_tokens, a.num_computed_tokens) == (5, 10)  # 6 prompt + 5 outputs, the last uncomputed
    # Slots for every token the group computed, and no more blocks than those tokens need.
    assert len(a.block_ids) == -(-a.num_computed_tokens // BLOCK_SIZE)


def test_a_step_that_admits_a_prompt_runs_once():
    scheduler = make_scheduler(steps=4)
    add(scheduler, "a", 5, max_tokens=20)
    run(scheduler)
    add(scheduler, "b", 5, max_tokens=20, arrival=1.0)
    out = run(scheduler)
    assert out.num_scheduled_tokens == {"a": 1, "b": 5} and out.decode_steps == {}
    assert run(scheduler).decode_steps == {"a": 4, "b": 4}


def test_groups_stop_at_the_model_length():
    scheduler = make_scheduler(steps=8, max_model_len=12)
    add(scheduler, "a", 8, max_tokens=100)
    run(scheduler)  # 9 tokens
    assert run(scheduler).decode_steps == {"a": 3}  # 12 tokens: the model's length


def test_single_step_scheduling_sends_no_decode_steps():
    scheduler = make_scheduler(steps=1)
    add(scheduler, "a", 5, max_tokens=20)
    run(scheduler)
    assert run(scheduler).decode_steps == {}
