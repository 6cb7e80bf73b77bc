"""The `mp` executor: a worker in a process of its own gives exactly what the in-process one gives, and its
failures surface as errors that name the worker, never as hangs."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.executor.worker_process import WorkerDiedError
from pagedllm.sampling_params import GuidedDecodingParams

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away,",
           "List three colors:", "1, 2, 3, 4,", "Why is the sky blue? Explain it to a child.",
           "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", "The quick brown fox"]
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=2)


def _gone(pid: int, within: float = 10.0) -> bool:
    """Whether process `pid` has exited (or is a zombie) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def _same(got: list, expected: list) -> None:
    """Equal tokens, and logprobs within 1e-4: a request preempted by recompute computes its earlier tokens
    again in one prefill, whose sums round differently from the decode steps that first computed them."""
    for g, e in zip(got, expected, strict=True):
        assert g.outputs[0].token_ids == e.outputs[0].token_ids
        for g_step, e_step in zip(g.outputs[0].logprobs, e.outputs[0].logprobs):
            assert {t: p.logprob for t, p in g_step.items()} == pytest.approx(
                {t: p.logprob for t, p in e_step.items()}, abs=1e-4)


@pytest.fixture(scope="module")
def mp_llm():
    """The default model on one worker process, with a KV cache too small for PROMPTS at once (12 blocks)."""
    llm = LLM(distributed_executor_backend="mp", num_gpu_blocks_override=12)
    yield llm
    llm.llm_engine.model_executor.shutdown()


def test_greedy_output_and_logprobs_equal_the_in_process_executor_through_preemption(llm, mp_llm):
    expected = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    scheduler = mp_llm.llm_engine.scheduler
    before = scheduler.num_preemptions
    _same(mp_llm.generate(PROMPTS, GREEDY, use_tqdm=False), expected)
    assert scheduler.num_preemptions > before
    assert scheduler.kv_cache.num_free_blocks == scheduler.kv_cache.num_blocks


def test_seeded_samples_guided_decoding_and_prefix_hits_equal_the_in_process_executor(llm, mp_llm):
    params = [SamplingParams(n=3, temperature=0.9, seed=7, max_tokens=12),
              SamplingParams(temperature=0, max_tokens=12, guided_decoding=GuidedDecodingParams(regex=r"[0-9]{3}-[a-z]+")),
              SamplingParams(temperature=0.7, seed=3, max_tokens=8, logits_processors=[lambda ids, logits: logits * 2])]
    prompts = ["Tell me a story about a cat who lives in a lighthouse by the sea and keeps its lamp burning every "
               "night for the ships that pass, and about the storm that came one winter", "My code is", "Hello"]
    expected = llm.generate(prompts, params, use_tqdm=False)
    got = mp_llm.generate(prompts, params, use_tqdm=False)
    assert [[c.text for c in o.outputs] for o in got] == [[c.text for c in o.outputs] for o in expected]
    assert len(got[0].outputs) == 3
    again = mp_llm.generate(prompts[:1], params[:1], use_tqdm=False)[0]
    assert again.num_cached_tokens > 0 and [c.text for c in again.outputs] == [c.text for c in got[0].outputs]


def test_collective_rpc_runs_a_function_on_the_worker_process(mp_llm):
    pids = mp_llm.collective_rpc(lambda worker: os.getpid())
    assert pids == [w.pid for w in mp_llm.llm_engine.model_executor.workers] and pids[0] != os.getpid()


def test_the_worker_process_runs_without_transformers(mp_llm):
    """Workers get the model's config as plain values (EngineConfig.for_worker_processes): importing
    transformers would cost each worker process seconds of start-up."""
    assert mp_llm.collective_rpc(lambda worker: "transformers" in sys.modules) == [False]


def test_an_exception_in_the_worker_fails_the_step_with_an_error_naming_the_worker(tiny_model_dir):
    llm = LLM(tiny_model_dir, distributed_executor_backend="mp")
    pid = llm.llm_engine.model_executor.workers[0].pid

    def broken_model(worker):
        def fail(*args, **kwargs):
            raise RuntimeError("out of memory in the forward pass")
        worker.model_runner.model.forward = fail

    llm.collective_rpc(broken_model)
    with pytest.raises(WorkerDiedError, match=rf"Worker 0 \(pid {pid}\) failed in execute_model: .*out of memory"):
        llm.generate("Hello", SamplingParams(max_tokens=4), use_tqdm=False)
    with pytest.raises(WorkerDiedError):
        llm.llm_engine.check_health()
    assert _gone(pid)


def test_a_killed_worker_is_noticed_within_seconds_and_the_engine_reports_unhealthy(tiny_model_dir):
    llm = LLM(tiny_model_dir, distributed_executor_backend="mp")
    pid = llm.llm_engine.model_executor.workers[0].pid
    llm.llm_engine.add_request("r", "Hello", SamplingParams(max_tokens=400, ignore_eos=True))
    llm.llm_engine.step()
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=rf"Worker 0 \(pid {pid}\) died"):
        while llm.llm_engine.has_unfinished_requests():
            llm.llm_engine.step()
    assert time.monotonic() - start < 5
    with pytest.raises(WorkerDiedError):
        llm.llm_engine.check_health()


def test_no_worker_process_remains_after_shutdown_or_when_the_parent_is_killed(tiny_model_dir):
    llm = LLM(tiny_model_dir, distributed_executor_backend="mp")
    pid = llm.llm_engine.model_executor.workers[0].pid
    llm.llm_engine.model_executor.shutdown()
    assert _gone(pid, within=1.0)
    script = (f"from pagedllm import LLM\nllm = LLM({tiny_model_dir!r}, distributed_executor_backend='mp')\n"
              "print(llm.llm_engine.model_executor.workers[0].pid, flush=True)\nimport time\ntime.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    worker_pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    assert _gone(worker_pid)


def test_a_killed_worker_errors_the_async_engine_and_its_requests(tiny_model_dir):
    import asyncio

    from pagedllm import AsyncEngineArgs, AsyncLLMEngine

    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=tiny_model_dir, distributed_executor_backend="mp"))
    pid = engine.engine.model_executor.workers[0].pid

    async def run() -> float:
        stream = engine.generate("Hello", SamplingParams(max_tokens=2000, ignore_eos=True), "r")
        await stream.__anext__()
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(Exception, match=rf"Worker 0 \(pid {pid}\) died"):
            async for _ in stream:
                pass
        with pytest.raises(Exception):
            await engine.check_health()
        return time.monotonic() - start

    assert asyncio.run(run()) < 5
    assert engine.errored


def test_a_request_failing_in_the_worker_process_fails_alone(llm, mp_llm):
    """The worker's report of a failed request crosses the process boundary as plain data."""
    def raises(output_ids, logits):
        if output_ids:
            raise ValueError("broken processor")
        return logits

    good = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    bad = SamplingParams(temperature=0, max_tokens=8, logits_processors=[raises])
    expected = llm.generate(PROMPTS[:2], good, use_tqdm=False)
    got = mp_llm.generate([PROMPTS[0], PROMPTS[2], PROMPTS[1]], [good, bad, good], use_tqdm=False)
    failed = got[1].outputs[0]
    assert failed.finish_reason == "error" and "ValueError: broken processor" in failed.stop_reason
    assert len(failed.token_ids) == 1
    assert [o.outputs[0].token_ids for o in (got[0], got[2])] == [o.outputs[0].token_ids for o in expected]
    later = mp_llm.generate(PROMPTS[:1], good, use_tqdm=False)[0]
    assert later.outputs[0].token_ids == expected[0].outputs[0].token_ids
