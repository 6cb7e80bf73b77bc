"""Weights that are exactly GGUF blocks (Q4_1: d * q + m, Q8_0: d * q) are packed as those blocks, and the panel
kernel decodes them to the same float32 values: outputs bit for bit those of float32 panels, at any row count.
Weights that are not exactly blocks stay float32."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from pagedllm import LLM, EngineArgs
from pagedllm.model.cpu_kernels import load_packed_linear
from pagedllm.model.layers import MergedLinear, linear_weight_bytes
from pagedllm.model.linear_backend import ENV_VAR
from pagedllm.model.loader import _pack_for_cpu
from pagedllm.model.weight_blocks import pack_blocks

BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}  # per panel column of a block of 32 steps of k


def _kernel():
    kernel = load_packed_linear()
    if kernel is None or kernel.blocks is None:
        pytest.skip("this build of the panel kernel has no block formats (it needs AVX2 and F16C)")
    return kernel


def _gguf_weight(kind: str, out: int, k: int, seed: int = 0) -> torch.Tensor:
    """A random float32 weight through a GGUF quantization and its dequantization (as the loader reads one)."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((out, k), dtype=np.float32) * 0.05
    qtype = GGMLQuantizationType[kind]
    return torch.from_numpy(np.array(dequantize(quantize(dense, qtype), qtype), dtype=np.float32))


# Rows: one to six (decoded as one tile multiplies: up to 4 with AVX2, 6 with AVX-512), seven and ten (two tiles
# that each decode the panel with AVX-512; decoded once into a buffer with AVX2), 11 and 19 (each panel decoded
# once, then several tiles), more than one chunk of 256 rows.
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 10, 11, 19, 300])
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_blocks_equal_float32_panels_bit_for_bit(kind, rows):
    kernel = _kernel()
    weight = _gguf_weight(kind, 5 * kernel.panel, 160, seed=rows)
    blocks = pack_blocks(weight, kernel.panel)
    assert blocks is not None and blocks.dtype == torch.uint8
    assert blocks.shape == (5, 160 // 32, BLOCK_BYTES[kind] * kernel.panel)
    x = torch.randn(rows, 160)
    got = kernel.blocks(x, blocks)
    assert torch.equal(got.view(torch.int32), kernel.float32(x, kernel.pack(weight)).view(torch.int32))
    torch.testing.assert_close(got, x @ weight.T, rtol=1e-5, atol=1e-4)


def test_blocks_with_equal_weights_decode_exactly():
    """A block whose weights are all equal (zero included) has no spread to derive d from: it takes d = 0."""
    kernel = _kernel()
    weight = _gguf_weight("Q4_1", kernel.panel, 96)
    weight[:, 32:64] = 0.25
    weight[3, :32] = 0.0
    blocks = pack_blocks(weight, kernel.panel)
    assert blocks is not None
    x = torch.randn(2, 96)
    assert torch.equal(kernel.blocks(x, blocks), kernel.float32(x, kernel.pack(weight)))


def test_weights_that_are_not_exactly_blocks_stay_float32():
    kernel = _kernel()
    assert pack_blocks(torch.randn(kernel.panel, 64), kernel.panel) is None
    weight = _gguf_weight("Q4_1", kernel.panel, 64)
    weight[5, 40] = torch.nextafter(weight[5, 40], torch.tensor(1.0))  # one weight a float32 step off its block
    assert pack_blocks(weight, kernel.panel) is None
    assert pack_blocks(_gguf_weight("Q8_0", kernel.panel, 64)[:, :48], kernel.panel) is None  # not whole blocks
    assert pack_blocks(_gguf_weight("Q8_0", kernel.panel + 8, 64), kernel.panel) is None  # not whole panels


def test_a_layer_of_blocks_computes_as_its_float32_panels():
    kernel = _kernel()
    layer = MergedLinear(128, [kernel.panel, 2 * kernel.panel])
    layer.weight.data.copy_(_gguf_weight("Q4_1", 3 * kernel.panel, 128))
    reference = MergedLinear(128, [kernel.panel, 2 * kernel.panel])
    reference.weight.data.copy_(layer.weight.data)
    assert layer.pack_blocks() and layer.weight is None and layer.in_blocks
    assert reference.pack_panels() and not reference.in_blocks
    x = torch.randn(3, 7, 128)
    assert torch.equal(layer(x), reference(x))


def _bf16_kernel():
    kernel = _kernel()
    if kernel.blocks_bf16 is None:
        pytest.skip("4-bit blocks take bfloat16 inputs only where the kernel has AVX512_BF16")
    return kernel


def _rounded_product(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x rounded to bfloat16 times the weight, in float64, and the same over absolute values (the scale of the
    float32 sums' rounding)."""
    rounded = x.bfloat16().double()
    return rounded @ weight.double().T, rounded.abs() @ weight.double().abs().T


# Rows: one (two panels a tile), two to four (a panel's three vectors), five to 12 (one tile of a vector), 13 and
# 25 (several tiles), more than one chunk of 256 rows.
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 12, 13, 25, 300])
def test_bf16_blocks_multiply_inputs_rounded_to_bfloat16(rows):
    kernel = _bf16_kernel()
    weight = _gguf_weight("Q4_1", 5 * kernel.panel, 160, seed=rows)
    blocks = pack_blocks(weight, kernel.panel, bfloat16_inputs=True)
    assert blocks is not None and blocks.shape == (5, 160 // 32, BLOCK_BYTES["Q4_1"] * kernel.panel)
    x = torch.randn(rows, 160) * torch.logspace(-3, 3, 160)  # inputs of many magnitudes, as activations are
    got = kernel.blocks_bf16(x, blocks)
    want, scale = _rounded_product(x, weight)
    # float32 sums of exact products: well within 1e-5 of the sum of magnitudes (1e-7 to 1e-6 measured)
    assert ((got.double() - want).abs() <= 1e-5 * scale).all()
    # against the unrounded inputs, bfloat16's rounding shows (a relative step of 2^-9 per input)
    assert not torch.equal(got, kernel.blocks(x, pack_blocks(weight, kernel.panel)))


def test_bf16_block_rows_are_the_same_in_any_batch():
    """Each row's sums take the same steps whatever the rows beside it: every row of a call of 1 to 40 rows (and
    of 300, two chunks) equals that row alone, bit for bit."""
    kernel = _bf16_kernel()
    weight = _gguf_weight("Q4_1", 3 * kernel.panel, 96)
    blocks = pack_blocks(weight, kernel.panel, bfloat16_inputs=True)
    x = torch.randn(300, 96)
    alone = torch.cat([kernel.blocks_bf16(x[i:i + 1], blocks) for i in range(300)])
    for rows in [*range(2, 41), 300]:
        assert torch.equal(kernel.blocks_bf16(x[:rows], blocks).view(torch.int32), alone[:rows].view(torch.int32))


def test_under_bfloat16_4bit_blocks_take_bfloat16_inputs_and_8bit_ones_stay_float32():
    kernel = _bf16_kernel()
    layers = {}
    for kind in ("Q4_1", "Q8_0"):
        layers[kind] = layer = MergedLinear(128, [2 * kernel.panel])
        layer.weight.data.copy_(_gguf_weight(kind, 2 * kernel.panel, 128))
    weights = {kind: layer.weight.data.clone() for kind, layer in layers.items()}
    _pack_for_cpu(list(layers.values()), bfloat16=True)
    assert all(layer.in_blocks for layer in layers.values())
    assert layers["Q4_1"].bfloat16_inputs and not layers["Q8_0"].bfloat16_inputs
    x = torch.randn(3, 128)
    want, scale = _rounded_product(x, weights["Q4_1"])
    assert ((layers["Q4_1"](x).double() - want).abs() <= 1e-5 * scale).all()
    assert torch.equal(layers["Q8_0"](x), kernel.float32(x, kernel.pack(weights["Q8_0"])))


def test_the_default_model_streams_its_gguf_blocks(llm):
    """Every linear layer of the default model (Q4_1 layers, a Q8_0 embedding as the tied LM head) is packed as
    blocks, under a fifth of float32's bytes; the greedy tests against transformers run on them."""
    panel = _kernel().panel
    model = llm.llm_engine.model_executor.worker.model_runner.model
    linears = [m for m in model.modules() if isinstance(m, MergedLinear)]
    assert linears and all(m.in_blocks for m in linears)
    weights = sum(m.panel_weight.shape[0] * panel * m.panel_weight.shape[1] * 32 for m in linears)
    assert linear_weight_bytes(model) < 0.2 * 4 * weights


@pytest.mark.parametrize("backend", [None, "panels", "torch"])
def test_the_loader_packs_blocks_unless_another_backend_is_named(backend, monkeypatch):
    kernel = _kernel()
    if backend is None:
        monkeypatch.delenv(ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(ENV_VAR, backend)
    layer = MergedLinear(64, [kernel.panel])
    layer.weight.data.copy_(_gguf_weight("Q8_0", kernel.panel, 64))
    _pack_for_cpu([layer], bfloat16=False)
    if backend == "torch":
        assert not layer.in_blocks and layer.panel_weight is None and layer.weight is not None
    else:
        assert layer.in_blocks


def test_quantization_gguf_is_the_gguf_blocks_on_cpu(default_model, tiny_model_dir):
    """vLLM's quantization="gguf": accepted for a GGUF file on CPU in float32 or bfloat16, where the blocks run anyway;
    refused, naming the field, where they cannot."""
    config = EngineArgs(model=default_model, quantization="gguf", device="cpu").create_engine_config()
    assert config.model_config.quantization == "gguf"
    with pytest.raises(ValueError, match="quantization='gguf' needs a GGUF model file"):
        EngineArgs(model=tiny_model_dir, quantization="gguf", device="cpu").create_engine_config()
    config = EngineArgs(model=default_model, quantization="gguf", device="cpu", dtype="bfloat16").create_engine_config()
    assert config.model_config.quantization == "gguf"
    with pytest.raises(ValueError, match="quantization='gguf' runs .* not on device='cpu' with dtype='float16'"):
        EngineArgs(model=default_model, quantization="gguf", device="cpu", dtype="float16").create_engine_config()
    with pytest.raises(ValueError, match="quantization 'fp8' is not supported; use None, 'int8' or 'gguf'"):
        EngineArgs(model=default_model, quantization="fp8").create_engine_config()


@pytest.mark.slow
def test_quantization_gguf_refuses_weights_it_cannot_stream_as_blocks(default_model, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "torch")
    with pytest.raises(ValueError, match=r"quantization='gguf': 121 of the model's 121 linear weights are not"):
        LLM(default_model, quantization="gguf", device="cpu")
