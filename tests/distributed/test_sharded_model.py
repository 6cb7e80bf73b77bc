"""A model split by tensor and pipeline parallelism over spawned processes gives the whole model's logits."""
from __future__ import annotations

import pytest
import torch

from pagedllm.config import EngineArgs
from sharded_run import run_sharded, run_whole

# Heads and KV heads divisible by 3 like the default model's; a vocabulary that 3 ranks split unevenly (the
# last rank's slice is padded); 4 layers, which 3 stages split unevenly.
TINY = dict(vocab_size=1000, hidden_size=96, intermediate_size=192, num_hidden_layers=4, num_attention_heads=6,
            num_key_value_heads=3, max_position_embeddings=128)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> dict[bool, str]:
    """Random-weight Llamas as Hugging Face folders, by whether their embeddings are tied."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folders = {}
    for tied in (True, False):
        folder = tmp_path_factory.mktemp("tiny-tied" if tied else "tiny-untied")
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(tie_word_embeddings=tied, **TINY)).save_pretrained(folder)
        folders[tied] = str(folder)
    return folders


def _model_config(model: str, **kwargs):
    return EngineArgs(model=model, device="cpu", skip_tokenizer_init=True, **kwargs).create_engine_config().model_config


@pytest.mark.parametrize("tp, pp, tied", [
    (3, 1, True),
    (1, 3, True),  # uneven stages; the last stage loads the tied table for its LM head itself
    (3, 2, False),
    (6, 1, False),  # more ranks than KV heads: each KV head replicated on two ranks
])
def test_tiny_model_sharded_equals_whole(tiny_dirs, tmp_path, tp, pp, tied):
    config = _model_config(tiny_dirs[tied])
    whole = run_whole(config)
    sharded = run_sharded(config, tp, pp, str(tmp_path))
    assert sharded.shape == whole.shape == (5, TINY["vocab_size"])
    torch.testing.assert_close(sharded, whole, atol=1e-4, rtol=1e-4)


def test_tiny_model_int8_sharded_stays_close_to_whole(tiny_dirs, tmp_path):
    config = _model_config(tiny_dirs[False], quantization="int8")
    whole = run_whole(config)
    sharded = run_sharded(config, 3, 1, str(tmp_path))
    _assert_int8_close(sharded, whole)


def _assert_int8_close(sharded: torch.Tensor, whole: torch.Tensor) -> None:
    """Row-parallel layers quantize each rank's input columns with their own scales, so sharded int8 is not
    the whole model's int8 bit for bit; its error stays within int8's own against float32."""
    error = (sharded - whole).abs().max() / whole.abs().max()
    assert 0 < error < 0.02
    assert (sharded.argmax(-1) == whole.argmax(-1)).float().mean() >= 0.8


@pytest.mark.slow
@pytest.mark.parametrize("tp, pp, quantization", [(3, 1, None), (1, 2, None), (3, 1, "int8")])
def test_default_model_sharded_equals_whole(default_model, tmp_path, tp, pp, quantization):
    config = _model_config(default_model, quantization=quantization)
    whole = run_whole(config)
    sharded = run_sharded(config, tp, pp, str(tmp_path))
    assert sharded.shape == whole.shape == (5, config.vocab_size)
    if quantization is None:
        torch.testing.assert_close(sharded, whole, atol=1e-3, rtol=1e-3)
        assert torch.equal(sharded.argmax(-1), whole.argmax(-1))
    else:
        _assert_int8_close(sharded, whole)
