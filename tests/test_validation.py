"""Bad input fails alone with vLLM's errors, and the engine keeps serving the other requests."""
from __future__ import annotations

import pickle
import types

import pytest

from pagedllm import LLM, EngineArgs, SamplingParams
from pagedllm.executor.uniproc import UniProcExecutor

LORA = types.SimpleNamespace(lora_name="adapter", lora_int_id=1, lora_path="/nonexistent")
BAD_REQUESTS = {
    "empty text": ("", {}, {}, ValueError, "The decoder prompt cannot be empty"),
    "empty tokens": ({"prompt_token_ids": []}, {}, {}, ValueError, "The decoder prompt cannot be empty"),
    "out of vocabulary": ({"prompt_token_ids": [1, 49152]}, {}, {}, ValueError, "Token id 49152 is out of vocabulary"),
    "negative token": ({"prompt_token_ids": [-1, 5]}, {}, {}, ValueError, "Token id -1 is out of vocabulary"),
    "too long": ({"prompt_token_ids": [5] * 8193}, {}, {}, ValueError,
                 r"The decoder prompt \(length 8193\) is longer than the maximum model length of 8192"),
    "logprobs": ("Hi", {"logprobs": 21}, {}, ValueError, "Cannot request more than 20 logprobs."),
    "prompt logprobs": ("Hi", {"prompt_logprobs": 21}, {}, ValueError, "Cannot request more than 20 logprobs."),
    "lora": ("Hi", {}, {"lora_request": LORA}, ValueError, "LoRA is not enabled"),
    "priority": ("Hi", {}, {"priority": 1}, ValueError, "Priority scheduling is not enabled"),
    "prompt type": (42, {}, {}, TypeError, "Unsupported prompt"),
}


def greedy(max_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


def run_to_completion(engine) -> dict:
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    return finished


@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_bad_request_fails_alone_and_the_engine_keeps_serving(llm, case):
    prompt, param_kwargs, request_kwargs, error, message = BAD_REQUESTS[case]
    engine = llm.llm_engine
    engine.add_request(f"good-{case}", "The weather today is", greedy(3))
    engine.step()
    with pytest.raises(error, match=message):
        engine.add_request(f"bad-{case}", prompt, greedy(3, **param_kwargs), **request_kwargs)
    assert engine.get_num_unfinished_requests() == 1
    finished = run_to_completion(engine)
    assert list(finished) == [f"good-{case}"]
    assert len(finished[f"good-{case}"].outputs[0].token_ids) == 3
    assert engine.scheduler.kv_cache.num_free_blocks == engine.scheduler.kv_cache.num_blocks


def test_non_string_request_id_is_a_type_error(llm):
    with pytest.raises(TypeError, match="request_id"):
        llm.llm_engine.add_request(7, "Hello", greedy(2))
    assert not llm.llm_engine.has_unfinished_requests()


def test_a_bad_prompt_in_generate_leaves_nothing_behind(llm):
    with pytest.raises(ValueError, match="out of vocabulary"):
        llm.generate(["Fine", {"prompt_token_ids": [10**6]}, "Also fine"], greedy(2), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert len(llm.generate("Fine", greedy(2), use_tqdm=False)[0].outputs[0].token_ids) == 2


def test_text_prompt_without_tokenizer_is_rejected(tiny_model_dir):
    llm = LLM(tiny_model_dir, skip_tokenizer_init=True, num_gpu_blocks_override=16)
    engine = llm.llm_engine
    engine.add_request("tokens", {"prompt_token_ids": [1, 2, 3]}, greedy(3))
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        engine.add_request("text", "Hello", greedy(3))
    finished = run_to_completion(engine)
    assert list(finished) == ["tokens"]
    assert len(finished["tokens"].outputs[0].token_ids) == 3 and finished["tokens"].outputs[0].text == ""


class CountingExecutor(UniProcExecutor):
    """The in-process executor, counting the steps it runs."""

    def _init_executor(self) -> None:
        self.steps = 0
        super()._init_executor()

    def execute_model(self, scheduler_output):
        self.steps += 1
        return super().execute_model(scheduler_output)


@pytest.mark.parametrize("backend", ["carrier-pigeon", dict])
def test_unknown_executor_backend_is_a_value_error(tiny_model_dir, backend):
    with pytest.raises(ValueError, match="distributed executor backend"):
        EngineArgs(model=tiny_model_dir, distributed_executor_backend=backend).create_engine_config()


def test_executor_subclass_runs_the_engine_and_answers_health_checks(tiny_model_dir):
    llm = LLM(tiny_model_dir, distributed_executor_backend=CountingExecutor, num_gpu_blocks_override=16)
    executor = llm.llm_engine.model_executor
    assert isinstance(executor, CountingExecutor)
    outputs = llm.generate(["One", "Two words"], greedy(3), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [3, 3]
    assert executor.steps == 3  # one prefill step, then two decode steps for both requests
    assert llm.llm_engine.check_health() is None
    executor.shutdown()
    with pytest.raises(RuntimeError):
        llm.llm_engine.check_health()


def test_collective_rpc_reaches_the_worker(llm):
    assert llm.collective_rpc("check_health") == [None]

    def rank_and_sum(worker, x, y=0):
        return worker.rank, x + y

    assert llm.collective_rpc(rank_and_sum, args=(2,), kwargs={"y": 3}) == [(0, 5)]
    assert llm.llm_engine.collective_rpc("determine_num_available_blocks") == [
        llm.llm_engine.scheduler.kv_cache.num_blocks]


def test_engine_refuses_pickling(llm):
    with pytest.raises(RuntimeError, match="pickled"):
        pickle.dumps(llm.llm_engine)
    with pytest.raises(RuntimeError, match="pickled"):
        pickle.dumps(llm)
