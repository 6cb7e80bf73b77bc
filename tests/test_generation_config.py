"""Defaults and extra EOS ids from the model folder's generation_config.json."""
from __future__ import annotations

import json
import shutil

import pytest

from pagedllm import LLM, SamplingParams


@pytest.mark.slow
def test_generation_config_defaults_and_extra_eos_ids(tiny_model_dir, tmp_path):
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    plain = LLM(tiny_model_dir, num_gpu_blocks_override=64)
    tokens = plain.generate("Hello there", greedy, use_tqdm=False)[0].outputs[0].token_ids
    extra_eos = tokens[-1]
    stop_at = tokens.index(extra_eos)
    folder = tmp_path / "with-generation-config"
    shutil.copytree(tiny_model_dir, folder)
    eos = plain.get_tokenizer().eos_token_id
    (folder / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [eos, extra_eos], "temperature": 0.6, "top_k": 7, "max_new_tokens": 12}))
    llm = LLM(str(folder), num_gpu_blocks_override=64)
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_k, defaults.max_tokens) == (0.6, 7, 12)
    stopped = llm.generate("Hello there", SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
    assert stopped.outputs[0].token_ids == tokens[:stop_at + 1] and stopped.outputs[0].finish_reason == "stop"
    ignored = llm.generate("Hello there", greedy, use_tqdm=False)[0]
    assert ignored.outputs[0].token_ids == tokens
    vllm_defaults = LLM(str(folder), num_gpu_blocks_override=64, generation_config="vllm")
    assert vllm_defaults.get_default_sampling_params().temperature == 1.0
