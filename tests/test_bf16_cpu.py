"""dtype="bfloat16" on CPU: linear weights stored in bfloat16 (half the bytes per decoded token), widened to
float32 by the panel kernel as it loads them, with float32 activations, sums and KV cache. Widening is exact,
so the engine computes exactly what float32 does on the weights rounded to bfloat16."""
from __future__ import annotations

import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.model.cpu_kernels import load_packed_linear
from pagedllm.model.layers import MergedLinear

_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 64, 129, 300])
def test_bfloat16_panels_equal_the_float32_kernel_on_the_widened_weight(rows):
    kernel = load_packed_linear()
    torch.manual_seed(rows)
    weight = torch.randn(kernel.panel * 5, 160).to(torch.bfloat16)
    x = torch.randn(rows, 160)
    got = kernel.bfloat16(x, kernel.pack(weight))
    assert torch.equal(got, kernel.float32(x, kernel.pack(weight.float())))
    torch.testing.assert_close(got, x @ weight.float().T, rtol=1e-5, atol=1e-4)


@pytest.fixture(scope="module")
def untied_model_dirs(tmp_path_factory, tokenizer) -> tuple[str, str]:
    """A tiny Llama with its own LM head, and a copy whose linear weights are rounded to bfloat16 (stored as
    float32); embeddings and norms are the same in both."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    folders = []
    for name in ("float32", "rounded"):
        folder = tmp_path_factory.mktemp(name)
        if name == "rounded":
            with torch.no_grad():
                for param_name, param in model.named_parameters():
                    if param_name.split(".")[-2] in _LINEARS:
                        param.copy_(param.to(torch.bfloat16).float())
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders.append(str(folder))
    return folders[0], folders[1]


def test_bfloat16_on_cpu_computes_float32_over_bfloat16_weights(untied_model_dirs):
    original, rounded = untied_model_dirs
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3)
    prompts = [{"prompt_token_ids": list(range(100 + 7 * i, 130 + 11 * i))} for i in range(4)]
    llm = LLM(original, dtype="bfloat16", num_gpu_blocks_override=64)
    engine = llm.llm_engine
    assert engine.model_config.dtype == torch.bfloat16 and engine.model_config.activation_dtype == torch.float32
    runner = engine.model_executor.worker.model_runner
    linears = [m for m in runner.model.modules() if isinstance(m, MergedLinear)]
    assert linears and all(m.panel_weight.dtype == torch.bfloat16 and m.weight is None for m in linears)
    assert runner.kv_caches[0][0][0].dtype == torch.float32
    assert runner._graph_kind() == "cpu"
    got = llm.generate(prompts, params, use_tqdm=False)
    del llm

    expected = LLM(rounded, dtype="float32", num_gpu_blocks_override=64).generate(prompts, params, use_tqdm=False)
    for ours, theirs in zip(got, expected):
        assert ours.outputs[0].token_ids == theirs.outputs[0].token_ids
        assert ours.outputs[0].logprobs == theirs.outputs[0].logprobs
