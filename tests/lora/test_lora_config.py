"""LoRA's engine arguments, validated as vLLM validates them, and LoRARequest's own checks."""
from __future__ import annotations

import pytest
import torch

from pagedllm import EngineArgs, LoRARequest


def test_defaults_and_max_cpu_loras_following_max_loras():
    config = EngineArgs(enable_lora=True, max_loras=3).create_engine_config().lora_config
    assert (config.max_loras, config.max_lora_rank, config.max_cpu_loras, config.lora_dtype) == (3, 16, 3,
                                                                                                 torch.float32)
    assert EngineArgs().create_engine_config().lora_config is None
    assert EngineArgs(enable_lora=True, lora_dtype="bfloat16").create_engine_config().lora_config.lora_dtype == \
        torch.bfloat16


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_lora_rank=7), r"max_lora_rank \(7\) must be one of \(8, 16, 32"),
    (dict(max_loras=0), r"max_loras \(0\) must be >= 1"),
    (dict(max_loras=4, max_cpu_loras=2), r"max_cpu_loras \(2\) must be >= max_loras \(4\)"),
    (dict(lora_dtype="int8"), "lora_dtype must be"),
    (dict(fully_sharded_loras=True), "fully_sharded_loras=True is not supported"),
    (dict(enable_lora_bias=True), "enable_lora_bias=True is not supported"),
])
def test_invalid_settings_raise_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs(enable_lora=True, **kwargs).create_engine_config()


def test_lora_request_checks_its_id_and_path_and_compares_by_name():
    with pytest.raises(ValueError, match="id must be > 0"):
        LoRARequest("a", 0, "/x")
    with pytest.raises(ValueError, match="lora_path"):
        LoRARequest("a", 1)
    assert LoRARequest("a", 1, "/x") == LoRARequest("a", 2, "/y") and LoRARequest("a", 1, "/x").adapter_id == 1
    from pagedllm.lora.request import LoRARequest as same

    assert same is LoRARequest
