"""speculative_config as vLLM takes it: what it parses to, the JSON command-line flag, and a ValueError naming
the field for every configuration that cannot run."""
from __future__ import annotations

import argparse

import pytest

from pagedllm.config import EngineArgs
from pagedllm.spec_decode.config import SpeculativeConfig, parse_speculative_config


def test_vllm_forms_parse():
    assert parse_speculative_config({"method": "ngram", "num_speculative_tokens": 4}) == SpeculativeConfig(
        "ngram", 4, prompt_lookup_max=4, prompt_lookup_min=1)
    self_draft = parse_speculative_config({"method": "draft_model", "quantization": "int8",
                                           "num_speculative_tokens": 3, "disable_by_batch_size": 8})
    assert (self_draft.model, self_draft.quantization, self_draft.disable_by_batch_size) == (None, "int8", 8)
    assert self_draft.num_lookahead_slots == 3
    draft = parse_speculative_config({"model": "/models/draft", "num_speculative_tokens": 2})
    assert (draft.method, draft.model, draft.quantization) == ("draft_model", "/models/draft", None)


@pytest.mark.parametrize("raw, field", [
    ({"method": "ngram"}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "eagle", "num_speculative_tokens": 2}, "method"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 3},
     "prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 0}, "prompt_lookup_max"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 2}, "draft_tensor_parallel_size"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "model"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "quantization": "fp8"}, "quantization"),
    ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 1}, "disable_by_batch_size"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "model": "/nonexistent/draft"}, "model"),
    ("ngram", "speculative_config"),
])
def test_invalid_configs_fail_at_start_naming_the_field(raw, field):
    with pytest.raises(ValueError, match=field):
        EngineArgs(speculative_config=raw).create_engine_config()


def test_a_draft_with_another_vocabulary_is_refused(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="same tokenizer"):
        EngineArgs(speculative_config={"method": "draft_model", "model": str(tmp_path),
                                       "num_speculative_tokens": 2}).create_engine_config()


def test_the_command_line_takes_json():
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 5}'])
    config = EngineArgs.from_cli_args(args).create_engine_config()
    assert config.speculative_config.num_speculative_tokens == 5
    assert config.scheduler_config.num_speculative_tokens == 5
