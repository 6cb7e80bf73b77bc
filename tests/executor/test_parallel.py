"""Tensor and pipeline parallelism on the default model, under the `mp` and `ray` executors: the same greedy
tokens and top logprobs as one in-process worker, up to near ties (a sharded model sums in another order)."""
from __future__ import annotations

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.config import EngineArgs

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away,",
           "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"]
PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)
TIE_MARGIN = 0.05
LOGPROB_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def expected(llm):
    return llm.generate(PROMPTS, PARAMS, use_tqdm=False)


@pytest.fixture(scope="module")
def pipeline_llm():
    """Two pipeline stages on the backend chosen for several workers (mp), shared by the tests below."""
    llm = LLM(pipeline_parallel_size=2, num_gpu_blocks_override=64)
    yield llm
    llm.llm_engine.model_executor.shutdown()


def _assert_equal_up_to_near_ties(outputs: list, expected: list) -> None:
    """Equal tokens, logprobs within LOGPROB_TOLERANCE; a first divergence only where the in-process run's top
    two logprobs are within TIE_MARGIN (after it the texts differ, so the comparison stops)."""
    for got, want in zip(outputs, expected, strict=True):
        got, want = got.outputs[0], want.outputs[0]
        for step, (token, reference) in enumerate(zip(got.token_ids, want.token_ids)):
            top = sorted(want.logprobs[step].values(), key=lambda p: p.rank)
            if token != reference:
                assert top[0].logprob - top[1].logprob < TIE_MARGIN, f"step {step}: {token} != {reference}"
                break
            assert got.logprobs[step][token].logprob == pytest.approx(top[0].logprob, abs=LOGPROB_TOLERANCE)


@pytest.mark.parametrize("kwargs", [
    dict(distributed_executor_backend="mp", tensor_parallel_size=3),
    dict(distributed_executor_backend="mp", pipeline_parallel_size=2),  # pipeline_llm
    dict(distributed_executor_backend="ray", tensor_parallel_size=3),
], ids=["mp-tp3", "mp-pp2", "ray-tp3"])
def test_sharded_greedy_output_equals_one_worker(request, kwargs, expected):
    shared = "pipeline_parallel_size" in kwargs
    llm = request.getfixturevalue("pipeline_llm") if shared else LLM(**kwargs, num_gpu_blocks_override=64)
    executor = llm.llm_engine.model_executor
    try:
        backend = llm.llm_engine.get_parallel_config().distributed_executor_backend
        assert backend == kwargs["distributed_executor_backend"]
        assert len(llm.collective_rpc("check_health")) == (3 if "tensor_parallel_size" in kwargs else 2)
        _assert_equal_up_to_near_ties(llm.generate(PROMPTS, PARAMS, use_tqdm=False), expected)
    finally:
        if not shared:
            executor.shutdown()


def test_pipeline_virtual_engines_each_schedule_their_own_requests(pipeline_llm, expected):
    engine = pipeline_llm.llm_engine
    try:
        assert len(engine.schedulers) == 2
        for i, prompt in enumerate(PROMPTS):
            engine.add_request(str(i), prompt, PARAMS)
        assert [engine.schedulers[ve].get_num_unfinished_requests() for ve in (0, 1)] == [2, 2]
        assert engine.has_unfinished_requests_for_virtual_engine(0) and engine.has_unfinished_requests_for_virtual_engine(1)
        planned = []
        for scheduler in engine.schedulers:
            schedule = scheduler.schedule
            scheduler.schedule = lambda schedule=schedule: planned.append(schedule()) or planned[-1]
        outputs = {}
        while engine.has_unfinished_requests():
            outputs.update((o.request_id, o) for o in engine.step() if o.finished)
        assert {out.virtual_engine for out in planned} == {0, 1}
        _assert_equal_up_to_near_ties([outputs[str(i)] for i in range(len(PROMPTS))], expected)
    finally:
        for scheduler in engine.schedulers:  # the shared engine plans as before
            vars(scheduler).pop("schedule", None)


def test_a_tensor_parallel_size_that_does_not_divide_the_heads_is_refused_at_start(default_model):
    with pytest.raises(ValueError, match=r"attention heads \(9\) must be divisible by tensor parallel size \(2\)"):
        EngineArgs(model=default_model, tensor_parallel_size=2).create_engine_config()


def test_the_in_process_executor_refuses_several_workers(default_model):
    with pytest.raises(ValueError, match="distributed_executor_backend='uni' runs one worker"):
        EngineArgs(model=default_model, tensor_parallel_size=3, distributed_executor_backend="uni"
                   ).create_engine_config()
