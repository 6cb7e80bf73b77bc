"""The per-step caps, and core/ staying pure Python (importable and usable without torch)."""
from __future__ import annotations

import os
import subprocess
import sys

from pagedllm.config import SchedulerConfig
from pagedllm.core.kv_cache import KVCacheManager
from pagedllm.core.request import Request, RequestStatus
from pagedllm.core.scheduler import Scheduler
from pagedllm.sampling_params import SamplingParams

PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "pagedllm")


def make_scheduler(max_num_seqs: int, budget: int) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=1024,
                             enable_chunked_prefill=False, preemption_mode=None, policy="fcfs",
                             num_scheduler_steps=1, watermark=0)
    return Scheduler(config, KVCacheManager(64, 16, 0))


def add(scheduler: Scheduler, name: str, prompt_len: int) -> None:
    scheduler.add_request(Request(name, list(range(1, prompt_len + 1)), SamplingParams(), arrival_time=0.0))


def run_step(scheduler: Scheduler) -> dict[str, int]:
    out = scheduler.schedule()
    scheduler.update_from_output(out, {rid: [7] for rid, n in out.num_scheduled_tokens.items()
                                       if scheduler.requests[rid].num_computed_tokens + n
                                       == scheduler.requests[rid].num_tokens})
    return out.num_scheduled_tokens


def test_max_num_seqs_caps_the_running_batch():
    scheduler = make_scheduler(max_num_seqs=2, budget=256)
    for name in "abc":
        add(scheduler, name, 5)
    assert run_step(scheduler) == {"a": 5, "b": 5}
    assert run_step(scheduler) == {"a": 1, "b": 1}
    scheduler.finish_requests(["a"], RequestStatus.FINISHED_STOPPED)
    assert run_step(scheduler) == {"b": 1, "c": 5}


def test_token_budget_caps_each_step():
    scheduler = make_scheduler(max_num_seqs=8, budget=32)
    add(scheduler, "a", 20)
    add(scheduler, "b", 20)
    assert run_step(scheduler) == {"a": 20}
    assert run_step(scheduler) == {"a": 1, "b": 20}
    assert run_step(scheduler) == {"a": 1, "b": 1}


def test_core_imports_and_schedules_without_torch():
    script = f"""
import importlib.abc, sys, types
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is not allowed in core")
sys.meta_path.insert(0, NoTorch())
package = types.ModuleType("pagedllm")
package.__path__ = [{PACKAGE_DIR!r}]  # skip the package __init__, which pulls in the engine
sys.modules["pagedllm"] = package
from pagedllm.config import SchedulerConfig
from pagedllm.core.kv_cache import KVCacheManager
from pagedllm.core.request import Request
from pagedllm.core.scheduler import Scheduler
from pagedllm.sampling_params import SamplingParams
scheduler = Scheduler(SchedulerConfig(8, 64, 64, False, None, "fcfs", 1), KVCacheManager(4, 16))
scheduler.add_request(Request("a", [1, 2, 3], SamplingParams(), 0.0))
assert list(scheduler.schedule().num_scheduled_tokens.values()) == [3]
assert "torch" not in sys.modules
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
