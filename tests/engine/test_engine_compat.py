"""LLMEngine's vLLM accessors and switches: building from a config with the caller's stat loggers, config
getters, the tokenizer group, cache resets and output type validation."""
from __future__ import annotations

import pytest

from pagedllm import EngineArgs, LLMEngine, SamplingParams
from pagedllm.engine.engine_compat import Device, UsageContext
from pagedllm.metrics.loggers import StatLoggerBase
from pagedllm.outputs import RequestOutput


class Recorder(StatLoggerBase):
    def __init__(self) -> None:
        super().__init__(local_interval=5.0)
        self.stats = []

    def log(self, stats) -> None:
        self.stats.append(stats)

    def info(self, type, obj) -> None:
        pass


@pytest.fixture(scope="module")
def engine_and_recorder(tiny_model_dir):
    recorder = Recorder()
    config = EngineArgs(model=tiny_model_dir, num_gpu_blocks_override=32).create_engine_config()
    engine = LLMEngine.from_vllm_config(config, usage_context=UsageContext.LLM_CLASS,
                                        stat_loggers={"recorder": recorder})
    return engine, recorder


def run(engine, request_id: str) -> RequestOutput:
    engine.add_request(request_id, "The sky is", SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    finished = []
    while engine.has_unfinished_requests():
        finished += [o for o in engine.step() if o.finished]
    return finished[0]


def test_from_vllm_config_uses_the_callers_stat_loggers(engine_and_recorder):
    engine, recorder = engine_and_recorder
    assert engine.stat_loggers == {"recorder": recorder} and engine.usage_context == UsageContext.LLM_CLASS
    run(engine, "logged")
    assert sum(s.num_generation_tokens_iter for s in recorder.stats) == 3


def test_from_engine_args_takes_usage_context_and_stat_loggers(tiny_model_dir):
    recorder = Recorder()
    engine = LLMEngine.from_engine_args(EngineArgs(model=tiny_model_dir, num_gpu_blocks_override=16),
                                        UsageContext.ENGINE_CONTEXT, {"recorder": recorder})
    assert engine.stat_loggers == {"recorder": recorder}


def test_config_getters(engine_and_recorder):
    engine, _ = engine_and_recorder
    assert engine.get_vllm_config() is engine.get_engine_config()
    assert engine.get_decoding_config().backend == "xgrammar"
    assert engine.get_lora_config() is None


def test_tokenizer_group_and_lora_tokenizer(engine_and_recorder):
    engine, _ = engine_and_recorder
    group = engine.get_tokenizer_group()
    assert group.tokenizer is engine.get_tokenizer() is engine.get_tokenizer(lora_request=None)
    assert group.encode("Hello there") == engine.get_tokenizer().encode("Hello there")


def test_no_tokenizer_group_without_a_tokenizer(tiny_model_dir):
    engine = LLMEngine.from_engine_args(EngineArgs(model=tiny_model_dir, skip_tokenizer_init=True,
                                                   num_gpu_blocks_override=16))
    with pytest.raises(ValueError, match="skip_tokenizer_init is True"):
        engine.get_tokenizer_group()


def test_cache_resets(engine_and_recorder):
    engine, _ = engine_and_recorder
    run(engine, "cached")
    assert engine.scheduler.kv_cache.num_free_blocks == engine.scheduler.kv_cache.num_blocks
    assert engine.reset_prefix_cache(Device.CPU) and engine.reset_prefix_cache(Device.GPU)
    assert engine.reset_prefix_cache() and engine.reset_mm_cache()


def test_output_validation_only_while_enabled(engine_and_recorder):
    engine, _ = engine_and_recorder
    output = run(engine, "validated")
    assert LLMEngine.validate_output("not an output", RequestOutput) == "not an output"
    with LLMEngine.enable_output_validation():
        assert LLMEngine.DO_VALIDATE_OUTPUT
        assert LLMEngine.validate_outputs([output], RequestOutput) == [output]
        with pytest.raises(TypeError, match="Expected output of type"):
            LLMEngine.validate_output("not an output", RequestOutput)
    assert not LLMEngine.DO_VALIDATE_OUTPUT
