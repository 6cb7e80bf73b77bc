"""The scheduler keeps at most max_loras distinct adapters in a step; the others wait their turn. The prefix
cache keys blocks by adapter."""
from __future__ import annotations

import itertools
from typing import Optional

from pagedllm.config import SchedulerConfig
from pagedllm.core.kv_cache import KVCacheManager
from pagedllm.core.request import Request
from pagedllm.core.scheduler import Scheduler
from pagedllm.lora.request import LoRARequest
from pagedllm.sampling_params import SamplingParams

_clock = itertools.count()


def make_scheduler(max_loras: int, caching: bool = False) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=1024,
                             enable_chunked_prefill=False, preemption_mode=None, policy="fcfs",
                             num_scheduler_steps=1, watermark=0, max_loras=max_loras)
    return Scheduler(config, KVCacheManager(64, 4, 0, enable_caching=caching))


def add(scheduler: Scheduler, name: str, lora_id: Optional[int], prompt: Optional[list[int]] = None) -> Request:
    lora = LoRARequest(f"lora{lora_id}", lora_id, "/adapters") if lora_id else None
    request = Request(name, prompt or [1, 2, 3], SamplingParams(max_tokens=4), arrival_time=float(next(_clock)),
                      lora_request=lora)
    scheduler.add_request(request)
    return request


def test_at_most_max_loras_adapters_per_step_others_wait_in_order():
    scheduler = make_scheduler(max_loras=2)
    for name, lora_id in [("a", 1), ("b", 2), ("c", 3), ("d", None), ("e", 1), ("f", 3)]:
        add(scheduler, name, lora_id)
    out = scheduler.schedule()
    assert list(out.num_scheduled_tokens) == ["a", "b", "d", "e"]
    assert [r.request_id for r in scheduler.waiting] == ["c", "f"]  # still first in line
    scheduler.finish_requests(["a", "b", "e"], status=scheduler.requests["a"].status.FINISHED_STOPPED)
    out = scheduler.schedule()
    assert list(out.num_scheduled_tokens) == ["d", "c", "f"]


def test_prefix_cache_hits_only_for_the_same_adapter():
    scheduler = make_scheduler(max_loras=2, caching=True)
    prompt = list(range(1, 14))  # three full blocks of 4
    first = add(scheduler, "a", 1, prompt)
    scheduler.update_from_output(scheduler.schedule(), {"a": [7]})
    other = add(scheduler, "b", 2, prompt)
    same = add(scheduler, "c", 1, prompt)
    base = add(scheduler, "d", None, prompt)
    scheduler.schedule()
    assert first.num_computed_tokens == 13
    assert (other.num_cached_tokens, same.num_cached_tokens, base.num_cached_tokens) == (0, 12, 0)


def test_lora_requests_info_names_running_and_waiting_adapters():
    from pagedllm.metrics.collector import StatsCollector

    scheduler = make_scheduler(max_loras=1)
    for name, lora_id in [("a", 1), ("b", 2), ("c", None), ("d", 1), ("e", 3)]:
        add(scheduler, name, lora_id)
    scheduler.schedule()
    stats = StatsCollector([scheduler], collect=True, max_lora=1).make_stats()
    assert (stats.running_lora_adapters, stats.waiting_lora_adapters, stats.max_lora) == (
        ["lora1"], ["lora2", "lora3"], "1")
