"""Sleep mode: sleep() releases the weights and the KV cache (resident memory drops), wake_up() restores
them, and the outputs after waking equal those before."""
from __future__ import annotations

import pytest

from pagedllm import LLM, SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _resident_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def sleepy_llm():
    llm = LLM(enable_sleep_mode=True, num_gpu_blocks_override=64)
    yield llm
    llm.llm_engine.model_executor.shutdown()


def test_level_1_releases_resident_memory_and_waking_restores_the_outputs(sleepy_llm):
    before = _tokens(sleepy_llm)
    resident = _resident_bytes()
    sleepy_llm.sleep(level=1)
    asleep = _resident_bytes()
    saved = sleepy_llm.llm_engine.model_executor.worker.offloaded.nbytes
    assert sleepy_llm.is_sleeping()
    # The weights' memory is released (a copy waits in a file), not merely marked unused.
    assert resident - asleep > 0.5 * saved > 50 * 2 ** 20, (resident, asleep, saved)
    greedy_head = sleepy_llm.llm_engine.model_executor.worker.model_runner.model.greedy_head
    assert greedy_head is None or greedy_head.approx.numel() == 0  # the bounded head's copy sleeps too
    with pytest.raises(RuntimeError, match="sleeping"):
        sleepy_llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
    sleepy_llm.wake_up()
    assert not sleepy_llm.is_sleeping()
    assert _tokens(sleepy_llm) == before


def test_level_2_reloads_the_weights_and_wakes_by_tags(sleepy_llm):
    before = _tokens(sleepy_llm)
    sleepy_llm.sleep(level=2)
    assert sleepy_llm.llm_engine.model_executor.worker.model_runner.model is None
    sleepy_llm.wake_up(tags=["kv_cache"])
    assert sleepy_llm.is_sleeping()
    with pytest.raises(RuntimeError, match="weights released"):
        sleepy_llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
    sleepy_llm.wake_up(tags=["weights"])
    assert not sleepy_llm.is_sleeping()
    assert _tokens(sleepy_llm) == before


def test_sleep_refuses_bad_calls(sleepy_llm, llm):
    with pytest.raises(ValueError, match="Sleep mode is not enabled"):
        llm.sleep()
    with pytest.raises(ValueError, match="level"):
        sleepy_llm.sleep(level=3)
    with pytest.raises(ValueError, match="tags"):
        sleepy_llm.wake_up(tags=["everything"])
    assert not sleepy_llm.is_sleeping()


def test_sleep_under_the_mp_executor(tiny_model_dir):
    llm = LLM(tiny_model_dir, enable_sleep_mode=True, distributed_executor_backend="mp", num_gpu_blocks_override=32)
    try:
        before = _tokens(llm)
        for level in (1, 2):
            llm.sleep(level=level)
            assert llm.collective_rpc(lambda worker: sorted(worker.asleep)) == [["kv_cache", "weights"]]
            llm.wake_up()
            assert _tokens(llm) == before
    finally:
        llm.llm_engine.model_executor.shutdown()
