"""Paged attention against dense causal attention, for every kind of sequence a step can hold."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedllm.core.request import Request
from pagedllm.model import attention
from pagedllm.model.attention import allocate_kv_cache, paged_attention, write_kv
from pagedllm.model.layers import MergedLinear
from pagedllm.sampling_params import SamplingParams
from pagedllm.worker.batch import build_model_input

HEADS, KV_HEADS, DIM, BLOCK = 4, 2, 8, 4


def _request(name: str, length: int, computed: int, block_ids: list[int]) -> Request:
    request = Request(name, list(range(1, length + 1)), SamplingParams(max_tokens=1), 0.0)
    request.num_computed_tokens = computed
    request.block_ids = block_ids
    return request


# A head size of 6 is no multiple of a vector: the C kernel then runs its one-float path.
@pytest.mark.parametrize("dim", [DIM, 6])
@pytest.mark.parametrize("kernel", ["C", "gathered"])
def test_paged_attention_matches_dense_attention(kernel, dim, monkeypatch):
    if kernel == "gathered":
        monkeypatch.setattr(attention, "load_attention_kernel", lambda *shape: None)
    else:
        assert attention.load_attention_kernel(HEADS // KV_HEADS, dim, BLOCK) is not None  # a C compiler is here
    torch.manual_seed(0)
    # (total tokens, already computed): two fresh prefills of one length (grouped), one of another, a chunk
    # after cached context, and decodes of different lengths (padded block tables); the last two attend over
    # several of the C kernel's 256-token segments, the last one partly filled.
    shapes = [(5, 0), (5, 0), (3, 0), (9, 6), (10, 9), (3, 2), (7, 6), (530, 520), (600, 599)]
    num_blocks = sum(-(-n // BLOCK) for n, _ in shapes)
    free = list(torch.randperm(num_blocks).tolist())
    requests = [_request(str(i), n, c, [free.pop() for _ in range(-(-n // BLOCK))]) for i, (n, c) in enumerate(shapes)]
    full = {r.request_id: [torch.randn(r.num_tokens, h, dim) for h in (HEADS, KV_HEADS, KV_HEADS)] for r in requests}
    cache = allocate_kv_cache(num_blocks, BLOCK, KV_HEADS, dim, torch.float32, torch.device("cpu"))
    for r in requests:  # the context computed in earlier steps
        slots = torch.tensor([r.block_ids[p // BLOCK] * BLOCK + p % BLOCK for p in range(r.num_computed_tokens)],
                             dtype=torch.long)
        write_kv(cache, full[r.request_id][1][:r.num_computed_tokens], full[r.request_id][2][:r.num_computed_tokens],
                 slots)
    batch = build_model_input([(r, r.num_tokens - r.num_computed_tokens) for r in requests], BLOCK,
                              torch.device("cpu"))
    q, k, v = (torch.cat([full[r.request_id][i][r.num_computed_tokens:] for r in batch.requests]) for i in range(3))
    write_kv(cache, k, v, batch.attn_metadata.slot_mapping)
    out = paged_attention(q, k, v, cache, batch.attn_metadata, dim ** -0.5)
    for r, start in zip(batch.requests, batch.query_starts):
        fq, fk, fv = (x.transpose(0, 1).unsqueeze(0) for x in full[r.request_id])
        dense = F.scaled_dot_product_attention(fq, fk, fv, is_causal=True, enable_gqa=True)[0].transpose(0, 1)
        n = r.num_tokens - r.num_computed_tokens
        torch.testing.assert_close(out[start:start + n], dense[r.num_computed_tokens:], atol=1e-5, rtol=1e-5)


def _random_layer(output_sizes: list[int], input_size: int = 64) -> MergedLinear:
    torch.manual_seed(0)
    layer = MergedLinear(input_size, output_sizes, bias=True)
    torch.nn.init.normal_(layer.weight)
    torch.nn.init.normal_(layer.bias)
    return layer


# Rows: one (decode), three (a tile over two panels), a partial tile, more than one tile, more than one chunk of
# 256 rows.
@pytest.mark.parametrize("rows", [1, 3, 5, 19, 300])
@pytest.mark.parametrize("kernel", ["C", "PyTorch"])
def test_int8_linear_stays_close_to_float(rows, kernel):
    layer = _random_layer([64, 32])  # 96 outputs: whole panels of the C kernel with or without AVX-512
    x = torch.randn(rows, 64)
    reference = layer(x)
    layer.quantize_int8()
    assert layer.weight.dtype == torch.int8
    dequantized = x @ (layer.weight.float() * layer.scales.unsqueeze(1)).T + layer.bias
    if kernel == "C":
        layer.pack_panels()
        assert layer.panel_weight is not None and layer.weight is None
    got = layer(x)
    torch.testing.assert_close(got, dequantized, atol=1e-4, rtol=1e-4)
    error = (got - reference).abs().max() / reference.abs().max()
    assert 0 < error < 0.02


@pytest.mark.parametrize("layout", ["oneDNN", "panels"])
@pytest.mark.parametrize("shape", [(1, 64), (3, 5, 64), (300, 64), (7, 77)])  # the last: an odd input size
def test_cpu_weight_layouts_equal_dense(layout, shape):
    layer = _random_layer([64, 32], input_size=shape[-1])
    x = torch.randn(*shape)
    reference = layer(x)
    if layout == "oneDNN":
        layer.pack_for_cpu()
        assert layer.packed_weight.is_mkldnn
    else:
        layer.pack_panels()
        assert layer.panel_weight.shape[0] * layer.panel_weight.shape[2] == 96
        assert layer.panel_weight.shape[1] == shape[-1]
    assert layer.weight is None
    torch.testing.assert_close(layer(x), reference, atol=1e-4, rtol=1e-4)


def test_panels_leave_a_layer_they_do_not_fit_dense():
    layer = _random_layer([40, 10])  # 50 outputs: no whole number of panels
    x = torch.randn(4, 64)
    reference = layer(x)
    layer.pack_panels()
    assert layer.panel_weight is None and layer.weight is not None
    torch.testing.assert_close(layer(x), reference)
