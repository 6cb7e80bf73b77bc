"""vLLM's V0 scheduling defaults and clear errors for settings that could never work."""
from __future__ import annotations

import pytest

from pagedllm.config import EngineArgs


def scheduler_config(**kwargs):
    return EngineArgs(**kwargs).create_engine_config().scheduler_config


def test_v0_defaults():
    config = scheduler_config(max_model_len=1024)
    assert (config.max_num_seqs, config.max_num_batched_tokens, config.enable_chunked_prefill) == (256, 2048, False)
    assert config.preemption_mode is None and config.policy == "fcfs" and config.watermark == 0.01
    assert scheduler_config(max_model_len=4096).max_num_batched_tokens == 4096
    assert scheduler_config(max_model_len=4096, enable_chunked_prefill=True).max_num_batched_tokens == 2048


@pytest.mark.parametrize("kwargs, words", [
    (dict(block_size=24), "block_size"),
    (dict(max_model_len=4096, max_num_batched_tokens=1024), "max_num_batched_tokens (1024) is smaller"),
    (dict(max_num_batched_tokens=64, max_num_seqs=128, enable_chunked_prefill=True), "at least max_num_seqs"),
    (dict(preemption_mode="evict"), "preemption_mode"),
    (dict(preemption_mode="swap", swap_space=0), "swap_space"),
    (dict(swap_space=-1), "swap_space"),
    (dict(scheduling_policy="lottery"), "scheduling_policy"),
    (dict(num_gpu_blocks_override=0), "num_gpu_blocks_override"),
])
def test_impossible_settings_name_the_field(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        EngineArgs(**kwargs).create_engine_config()


def test_prefix_caching_is_on_unless_turned_off():
    assert EngineArgs().create_engine_config().cache_config.enable_prefix_caching
    assert not EngineArgs(enable_prefix_caching=False).create_engine_config().cache_config.enable_prefix_caching


def test_chunked_prefill_allows_a_budget_below_max_model_len():
    assert scheduler_config(max_model_len=4096, max_num_batched_tokens=32, max_num_seqs=32,
                            enable_chunked_prefill=True).max_num_batched_tokens == 32
