"""A model split by tensor and pipeline parallelism over spawned processes gives the whole model's logits."""
from __future__ import annotations

import pytest
import torch

from pagedllm.config import EngineArgs
from sharded_run import run_sharded, run_whole, run_whole_int8_as_sharded

# Query heads divisible by 2 and 3; a vocabulary that several ranks split unevenly (the last rank's slice is
# padded); 4 layers, which 3 stages split unevenly.
TINY = dict(vocab_size=1000, hidden_size=96, intermediate_size=192, num_hidden_layers=4, num_attention_heads=6,
            max_position_embeddings=128)
# By name: 3 KV heads (grouped-query, as the default model) with tied embeddings; 1 KV head (multi-query,
# replicated on every tensor-parallel rank) with an LM head of its own.
VARIANTS = {"gqa-tied": dict(num_key_value_heads=3, tie_word_embeddings=True),
            "mqa-untied": dict(num_key_value_heads=1, tie_word_embeddings=False)}


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> dict[str, str]:
    """Random-weight Llamas as Hugging Face folders, by variant name."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folders = {}
    for name, variant in VARIANTS.items():
        folders[name] = str(tmp_path_factory.mktemp(name))
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**TINY, **variant)).save_pretrained(folders[name])
    return folders


def _model_config(model: str, **kwargs):
    return EngineArgs(model=model, device="cpu", skip_tokenizer_init=True, **kwargs).create_engine_config().model_config


@pytest.mark.parametrize("variant, tp, pp", [
    ("gqa-tied", 3, 1),
    ("gqa-tied", 1, 3),  # uneven stages; the last stage loads the tied table for its LM head itself
    ("mqa-untied", 2, 2),  # both at once: ranks 0-1 run stage 0, ranks 2-3 stage 1
])
def test_tiny_model_sharded_equals_whole(tiny_dirs, tmp_path, variant, tp, pp):
    config = _model_config(tiny_dirs[variant])
    whole = run_whole(config)
    sharded = run_sharded(config, tp, pp, str(tmp_path))
    assert sharded.shape == whole.shape == (5, TINY["vocab_size"])
    torch.testing.assert_close(sharded, whole, atol=1e-4, rtol=1e-4)


def test_tiny_model_int8_sharded_equals_whole_rounded_alike(tiny_dirs, tmp_path):
    config = _model_config(tiny_dirs["gqa-tied"], quantization="int8")
    _assert_int8_equal(run_sharded(config, 3, 1, str(tmp_path)), run_whole_int8_as_sharded(config, 3))


def _assert_int8_equal(sharded: torch.Tensor, reference: torch.Tensor) -> None:
    """Row-parallel layers scale each rank's input columns on their own, so sharded int8 differs from the
    whole model's int8 (on the default model, as much as whole int8 differs from float32); against the whole
    model rounded the same way it differs only by the kernels' summation order (the panel kernel's tiles
    differ between a shard's and the whole layer's widths, so a few logits of the default model move by
    about 5e-3)."""
    torch.testing.assert_close(sharded, reference, atol=1e-2, rtol=1e-3)
    assert torch.equal(sharded.argmax(-1), reference.argmax(-1))


@pytest.fixture(scope="module")
def default_whole(default_model) -> torch.Tensor:
    """The default model's logits, whole in this process: the reference of every float32 split."""
    return run_whole(_model_config(default_model))


@pytest.mark.slow
@pytest.mark.parametrize("tp, pp, quantization", [(3, 1, None), (1, 2, None), (3, 1, "int8")])
def test_default_model_sharded_equals_whole(request, default_model, tmp_path, tp, pp, quantization):
    config = _model_config(default_model, quantization=quantization)
    sharded = run_sharded(config, tp, pp, str(tmp_path))
    if quantization == "int8":
        _assert_int8_equal(sharded, run_whole_int8_as_sharded(config, tp))
        return
    whole = request.getfixturevalue("default_whole")
    assert sharded.shape == whole.shape == (5, config.vocab_size)
    # Row-parallel layers add the ranks' partial sums in another order than one matmul does; over 30 layers
    # float32 rounding reaches about 1e-3 on logits of magnitude 10-20 (seen: 1.5e-3), and no token changes.
    torch.testing.assert_close(sharded, whole, atol=3e-3, rtol=1e-3)
    assert torch.equal(sharded.argmax(-1), whole.argmax(-1))
