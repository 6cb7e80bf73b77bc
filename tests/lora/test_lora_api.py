"""add_lora, remove_lora, list_loras and pin_lora, and bad adapters failing their own request only."""
from __future__ import annotations

import json
import shutil

import pytest

from pagedllm import LoRARequest, SamplingParams

pytestmark = pytest.mark.slow

PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def test_add_list_pin_remove(lora_llm, adapters):
    request = LoRARequest("api", 50, adapters[0])
    assert lora_llm.add_lora(request) is True
    assert lora_llm.add_lora(request) is False  # already held
    assert 50 in lora_llm.list_loras()
    assert lora_llm.pin_lora(50) is True
    assert lora_llm.remove_lora(50) is True
    assert 50 not in lora_llm.list_loras()
    assert lora_llm.remove_lora(50) is False
    with pytest.raises(ValueError, match="not loaded"):
        lora_llm.pin_lora(50)


def _copy(adapter: str, folder, edit=None):
    shutil.copytree(adapter, folder)
    if edit is not None:
        config = json.loads((folder / "adapter_config.json").read_text())
        edit(config)
        (folder / "adapter_config.json").write_text(json.dumps(config))
    return str(folder)


def test_bad_adapters_fail_their_request_and_the_engine_goes_on(lora_llm, adapters, make_adapter, tmp_path):
    high_rank = tmp_path / "rank32"
    make_adapter(high_rank, seed=1, rank=32, targets=["q_proj"])
    missing = _copy(adapters[0], tmp_path / "missing")
    (tmp_path / "missing" / "adapter_model.safetensors").unlink()
    unknown = _copy(adapters[0], tmp_path / "unknown",
                    lambda c: c.update(target_modules=["q_proj", "lm_head"]))
    cases = [(str(high_rank), "LoRA rank 32 .* greater than max_lora_rank 16"),
             (missing, "No adapter_model.safetensors or adapter_model.bin"),
             (unknown, r"unknown module\(s\) \['lm_head'\]"),
             (str(tmp_path / "nowhere"), "No adapter_config.json")]
    for i, (path, message) in enumerate(cases):
        with pytest.raises(ValueError, match=message):
            lora_llm.generate("Hello", PARAMS, use_tqdm=False, lora_request=LoRARequest(f"bad{i}", 60 + i, path))
    assert not lora_llm.llm_engine.has_unfinished_requests()
    assert len(lora_llm.generate("Hello", PARAMS, use_tqdm=False)[0].outputs[0].token_ids) == 4


def test_adapter_weights_in_bin_format_give_the_same_tokens(lora_llm, adapters, tmp_path):
    import torch
    from safetensors.torch import load_file

    folder = tmp_path / "bin"
    shutil.copytree(adapters[0], folder)
    torch.save(load_file(folder / "adapter_model.safetensors"), folder / "adapter_model.bin")
    (folder / "adapter_model.safetensors").unlink()
    safetensors_out = lora_llm.generate("Hello", PARAMS, use_tqdm=False,
                                        lora_request=LoRARequest("adapter0", 1, adapters[0]))
    bin_out = lora_llm.generate("Hello", PARAMS, use_tqdm=False, lora_request=LoRARequest("bin", 70, str(folder)))
    assert bin_out[0].outputs[0].token_ids == safetensors_out[0].outputs[0].token_ids
    lora_llm.remove_lora(70)


def test_chat_with_an_adapter_and_without_lora_enabled(lora_llm, llm, adapters):
    messages = [{"role": "user", "content": "Name a color."}]
    with_adapter = lora_llm.chat(messages, PARAMS, use_tqdm=False, lora_request=LoRARequest("adapter0", 1, adapters[0]))
    base = lora_llm.chat(messages, PARAMS, use_tqdm=False)
    assert with_adapter[0].outputs[0].token_ids != base[0].outputs[0].token_ids
    assert with_adapter[0].lora_request.lora_name == "adapter0"
    with pytest.raises(ValueError, match="LoRA is not enabled"):
        llm.generate("Hello", PARAMS, use_tqdm=False, lora_request=LoRARequest("adapter0", 1, adapters[0]))
