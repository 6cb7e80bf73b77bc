"""The C layer steps of the CPU path against the PyTorch operators they replace."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedllm import LLM, SamplingParams
from pagedllm.model import cpu_kernels
from pagedllm.model.attention import allocate_kv_cache, write_kv
from pagedllm.model.layers import RotaryEmbedding

HEADS, KV_HEADS, DIM = 6, 2, 16


@pytest.fixture(scope="module")
def ops() -> cpu_kernels.LayerOps:
    ops = cpu_kernels.load_layer_ops()
    assert ops is not None  # a C compiler is on this machine
    return ops


@pytest.mark.parametrize("shape", [(3, 96), (2, 150, 96)])  # one thread, and rows enough to run in parallel
def test_add_rms_norm(ops, shape):
    torch.manual_seed(0)
    x, residual, weight = torch.randn(shape), torch.randn(shape), torch.randn(96)
    torch.testing.assert_close(ops.add_rms_norm(x, None, weight, 1e-5), F.rms_norm(x, (96,), weight, 1e-5))
    expected_residual = residual + x
    normed = ops.add_rms_norm(x, residual, weight, 1e-5)
    torch.testing.assert_close(residual, expected_residual)  # updated in place
    torch.testing.assert_close(normed, F.rms_norm(expected_residual, (96,), weight, 1e-5))


def test_rope_and_cache(ops):
    torch.manual_seed(0)
    tokens = 5
    rotary = RotaryEmbedding(DIM, 64, {"rope_theta": 10000.0})
    positions = rotary.at(torch.tensor([0, 3, 7, 8, 40]))
    qkv = torch.randn(tokens, HEADS + 2 * KV_HEADS, DIM)
    slots = torch.tensor([9, 2, 30, 31, 0])
    expected_cache = allocate_kv_cache(8, 4, KV_HEADS, DIM, torch.float32, torch.device("cpu"))
    rotated = RotaryEmbedding.apply(qkv[:, :HEADS + KV_HEADS], positions.cos_sin)
    write_kv(expected_cache, rotated[:, HEADS:], qkv[:, HEADS + KV_HEADS:], slots)

    cache = allocate_kv_cache(8, 4, KV_HEADS, DIM, torch.float32, torch.device("cpu"))
    ops.rope_and_cache(qkv, positions.cos_table, positions.sin_table, positions.positions, slots, *cache, HEADS)
    torch.testing.assert_close(qkv[:, :HEADS + KV_HEADS], rotated)
    for got, expected in zip(cache, expected_cache):
        torch.testing.assert_close(got, expected)


def test_silu_and_mul(ops):
    torch.manual_seed(0)
    gate_up = torch.randn(2, 4, 2 * 40) * 30  # large magnitudes reach both ends of exp's range
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(ops.silu_and_mul(gate_up), F.silu(gate) * up, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [3, 40])  # one thread, and rows enough to run in parallel
def test_row_max_equals_torch_max_with_ties_infinities_and_nan(rows):
    row_max = cpu_kernels.load_row_max()
    assert row_max is not None
    generator = torch.Generator().manual_seed(0)
    # Few distinct values across blocks of the kernel's pass, so that maxima tie within and across blocks.
    x = torch.randint(-3, 3, (rows, 1300), generator=generator).float()
    x[0] = float("-inf")  # every token masked
    x[1, :700] = float("-inf")
    x[1, 1299] = 5.0  # the maximum in the last, partial block
    x[2, 9], x[2, 600] = float("nan"), float("nan")  # the first NaN, as torch.max gives it
    x[-1, 17] = float("inf")
    for logits in (x, torch.cat([x, x], dim=1)[:, 3:1303]):  # contiguous, and rows apart by more than their length
        values, indices = row_max(logits)
        expected = logits.max(dim=-1)
        assert torch.equal(indices, expected.indices)
        assert torch.equal(values.nan_to_num(), expected.values.nan_to_num())


@pytest.mark.slow
def test_model_with_c_layer_steps_equals_pytorch_operators(tiny_model_dir, monkeypatch):
    prompts = [{"prompt_token_ids": list(range(10 + i, 40 + 5 * i))} for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3)
    with_c = LLM(tiny_model_dir, num_gpu_blocks_override=64).generate(prompts, params, use_tqdm=False)
    monkeypatch.setattr(cpu_kernels, "load_layer_ops", lambda: None)
    with_torch = LLM(tiny_model_dir, num_gpu_blocks_override=64).generate(prompts, params, use_tqdm=False)
    for c, t in zip(with_c, with_torch):
        assert c.outputs[0].token_ids == t.outputs[0].token_ids
        assert c.outputs[0].cumulative_logprob == pytest.approx(t.outputs[0].cumulative_logprob, abs=1e-4)
