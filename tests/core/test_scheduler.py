"""The scheduler without a model: budgets, admission, preemption order, requests that can never fit."""
from __future__ import annotations

import os
import subprocess
import sys

from pagedllm.config import SchedulerConfig
from pagedllm.core.kv_cache import KVCacheManager
from pagedllm.core.request import Request, RequestStatus
from pagedllm.core.scheduler import Scheduler, SchedulerOutput
from pagedllm.sampling_params import SamplingParams

BLOCK = 16


def make_scheduler(num_blocks: int = 64, max_num_seqs: int = 256, budget: int = 2048,
                   watermark: float = 0.0) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=2048,
                             enable_chunked_prefill=False, preemption_mode=None, policy="fcfs",
                             num_scheduler_steps=1, watermark=watermark)
    return Scheduler(config, KVCacheManager(num_blocks, BLOCK, watermark))


def add(scheduler: Scheduler, request_id: str, num_tokens: int) -> Request:
    request = Request(request_id, list(range(1, num_tokens + 1)), SamplingParams(), arrival_time=0.0)
    scheduler.add_request(request)
    return request


def step(scheduler: Scheduler) -> SchedulerOutput:
    """Schedule, then play the model: every request that computes its last token samples token 7."""
    output = scheduler.schedule()
    sampled = {r.request_id: 7 for r, n in output.scheduled if r.num_computed_tokens + n == r.num_tokens}
    scheduler.update_from_output(output, sampled)
    return output


def plan(output: SchedulerOutput) -> dict[str, int]:
    return {r.request_id: n for r, n in output.scheduled}


def test_prefill_then_decode_with_exact_blocks():
    scheduler = make_scheduler()
    a, b = add(scheduler, "a", 20), add(scheduler, "b", 16)
    assert plan(step(scheduler)) == {"a": 20, "b": 16}
    assert (a.block_ids, b.block_ids) == ([0, 1], [2])
    assert a.num_computed_tokens == 20 and a.output_token_ids == [7]
    assert plan(step(scheduler)) == {"a": 1, "b": 1}
    # b's 17th token opened a new block; a still fits in its two.
    assert (a.block_ids, b.block_ids) == ([0, 1], [2, 3])
    assert scheduler.kv_cache.num_free_blocks == 60


def test_token_budget_limits_admission_without_chunked_prefill():
    scheduler = make_scheduler(budget=32)
    add(scheduler, "a", 20)
    add(scheduler, "b", 20)
    assert plan(step(scheduler)) == {"a": 20}
    # Next step a decodes (1 token) and b's whole prompt fits the remaining 31.
    assert plan(step(scheduler)) == {"a": 1, "b": 20}
    assert plan(step(scheduler)) == {"a": 1, "b": 1}


def test_max_num_seqs_caps_the_running_batch():
    scheduler = make_scheduler(max_num_seqs=2)
    for name in "abc":
        add(scheduler, name, 5)
    assert plan(step(scheduler)) == {"a": 5, "b": 5}
    assert [r.request_id for r in scheduler.waiting] == ["c"]
    assert plan(step(scheduler)) == {"a": 1, "b": 1}
    scheduler.finish_requests(["a"], RequestStatus.FINISHED_STOPPED)
    assert plan(step(scheduler)) == {"b": 1, "c": 5}


def test_finished_requests_free_their_blocks_and_are_reported_once():
    scheduler = make_scheduler(num_blocks=8)
    a = add(scheduler, "a", 40)
    add(scheduler, "b", 3)
    step(scheduler)
    assert scheduler.kv_cache.num_free_blocks == 4
    assert scheduler.finish_requests(["a", "unknown"], RequestStatus.FINISHED_ABORTED) == [a]
    assert a.status == RequestStatus.FINISHED_ABORTED and a.block_ids == []
    assert scheduler.kv_cache.num_free_blocks == 7
    assert scheduler.finish_requests(["a"], RequestStatus.FINISHED_ABORTED) == []
    assert scheduler.schedule().finished_req_ids == {"a"}
    assert scheduler.schedule().finished_req_ids == set()


def test_abort_of_a_waiting_request_leaves_the_queue():
    scheduler = make_scheduler(max_num_seqs=1)
    add(scheduler, "a", 5)
    b = add(scheduler, "b", 5)
    step(scheduler)
    assert scheduler.finish_requests(["b"], RequestStatus.FINISHED_ABORTED) == [b]
    assert not scheduler.waiting
    assert scheduler.get_num_unfinished_requests() == 1


def test_preemption_takes_the_newest_running_request_and_puts_it_at_the_front_of_the_queue():
    # Three requests, each exactly filling one block; 4 blocks in all.
    scheduler = make_scheduler(num_blocks=4)
    a, b, c = add(scheduler, "a", 16), add(scheduler, "b", 16), add(scheduler, "c", 16)
    step(scheduler)
    d = add(scheduler, "d", 3)
    # Each needs a second block for its 17th token: a takes the last free one, b preempts c.
    output = step(scheduler)
    assert plan(output) == {"a": 1, "b": 1}
    assert output.preempted == [c]
    assert c.status == RequestStatus.PREEMPTED and c.num_computed_tokens == 0 and c.block_ids == []
    assert list(scheduler.waiting) == [c, d]
    assert scheduler.num_preemptions == 1
    # Nothing is admitted in a step that preempted; the preempted request keeps its output token.
    assert c.output_token_ids == [7] and c.num_tokens == 17


def test_preempting_several_keeps_their_order_at_the_front():
    scheduler = make_scheduler(num_blocks=3)
    a, b, c = add(scheduler, "a", 16), add(scheduler, "b", 16), add(scheduler, "c", 16)
    step(scheduler)
    for _ in range(16):  # a now holds 33 tokens of which 16 are computed: it needs two more blocks
        a.append_output_token(7)
    output = scheduler.schedule()
    assert output.preempted == [c, b]
    assert list(scheduler.waiting) == [b, c]
    assert plan(output) == {"a": 17}
    assert a.block_ids == [0, 2, 1]


def test_the_newest_running_request_gives_way_to_an_older_one():
    scheduler = make_scheduler(num_blocks=2)
    a, b = add(scheduler, "a", 16), add(scheduler, "b", 16)
    step(scheduler)
    output = step(scheduler)
    assert output.preempted == [b]
    assert plan(output) == {"a": 1}
    assert a.block_ids == [0, 1]


def test_a_request_that_outgrows_the_whole_cache_preempts_itself_then_finishes_as_length():
    scheduler = make_scheduler(num_blocks=2)
    a = add(scheduler, "a", 32)
    step(scheduler)
    output = scheduler.schedule()
    assert output.preempted == [a] and not output.scheduled
    output = scheduler.schedule()
    assert output.ignored == [a] and a.status.finish_reason == "length"
    assert not scheduler.has_unfinished_requests()
    assert scheduler.kv_cache.num_free_blocks == 2


def test_preempted_request_is_recomputed_from_scratch_when_room_returns():
    scheduler = make_scheduler(num_blocks=4)
    a, b, c = add(scheduler, "a", 16), add(scheduler, "b", 16), add(scheduler, "c", 16)
    step(scheduler)
    step(scheduler)  # preempts c
    scheduler.finish_requests(["a"], RequestStatus.FINISHED_STOPPED)
    output = step(scheduler)
    # c comes back with its prompt and its earlier output token, all recomputed.
    assert plan(output) == {"b": 1, "c": 17}
    assert c.status == RequestStatus.RUNNING and c.output_token_ids == [7, 7]


def test_watermark_holds_back_admission():
    scheduler = make_scheduler(num_blocks=10, watermark=0.2)  # 2 blocks of watermark
    add(scheduler, "a", 16 * 5)
    add(scheduler, "b", 16 * 3 + 1)  # 4 blocks: would leave only 1 free
    assert plan(step(scheduler)) == {"a": 80}
    assert plan(scheduler.schedule()) == {"a": 1}  # a takes its 6th block; b still waits
    assert [r.request_id for r in scheduler.waiting] == ["b"]


def test_a_prompt_that_can_never_fit_is_finished_without_running():
    scheduler = make_scheduler(num_blocks=4)
    too_long = add(scheduler, "too_long", 16 * 4 + 1)
    ok = add(scheduler, "ok", 10)
    output = step(scheduler)
    assert output.ignored == [too_long]
    assert too_long.status == RequestStatus.FINISHED_IGNORED
    assert too_long.status.finish_reason == "length"
    assert plan(output) == {"ok": 10}
    assert scheduler.kv_cache.num_free_blocks == 3


def test_core_imports_without_torch(tmp_path):
    """core/ is pure Python: it imports and schedules with torch made unimportable."""
    package_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                               "pagedllm")
    script = f"""
import importlib.abc, sys, types
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is not allowed in core")
sys.meta_path.insert(0, NoTorch())
package = types.ModuleType("pagedllm")
package.__path__ = [{package_dir!r}]  # skip the package __init__, which pulls in the engine
sys.modules["pagedllm"] = package
from pagedllm.config import SchedulerConfig
from pagedllm.core.kv_cache import KVCacheManager
from pagedllm.core.request import Request
from pagedllm.core.scheduler import Scheduler
from pagedllm.sampling_params import SamplingParams
config = SchedulerConfig(8, 64, 64, False, None, "fcfs", 1)
scheduler = Scheduler(config, KVCacheManager(4, 16))
scheduler.add_request(Request("a", [1, 2, 3], SamplingParams(), 0.0))
assert [n for _, n in scheduler.schedule().scheduled] == [3]
assert "torch" not in sys.modules
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
