"""The Triton paged-attention kernel against dense causal attention, on CPU through Triton's interpreter and on
CUDA where there is one: prefills with and without cached context, decodes, and verification rows."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernel is defined, so before it is imported
import torch.nn.functional as F

from pagedllm.core.request import Request
from pagedllm.model import triton_attention
from pagedllm.model.attention import allocate_kv_cache, paged_attention, write_kv
from pagedllm.sampling_params import SamplingParams
from pagedllm.worker.batch import build_model_input

pytest.importorskip("triton")

# Three query heads per KV head (padded to four rows in the kernel), a head size that is not a power of two.
HEADS, KV_HEADS, DIM, BLOCK = 6, 2, 24, 4
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _request(name: str, length: int, computed: int, block_ids: list[int], spec: int = 0) -> Request:
    request = Request(name, list(range(1, length + 1)), SamplingParams(max_tokens=1), 0.0)
    request.num_computed_tokens = computed
    request.block_ids = block_ids
    request.spec_token_ids = list(range(spec))
    return request


def _step(shapes: list[tuple[int, int, int]], dtype: torch.dtype, num_blocks: int = 64):
    """A step over requests (tokens, computed, proposed), their cache filled with the computed context:
    returns the batch, q/k/v of the step's tokens, the cache and each request's full q/k/v."""
    torch.manual_seed(0)
    free = torch.randperm(num_blocks).tolist()
    requests = [_request(str(i), n, c, [free.pop() for _ in range(-(-(n + s) // BLOCK))], s)
                for i, (n, c, s) in enumerate(shapes)]
    full = {r.request_id: [torch.randn(r.num_tokens + len(r.spec_token_ids), h, DIM, dtype=dtype)
                           for h in (HEADS, KV_HEADS, KV_HEADS)] for r in requests}
    cache = allocate_kv_cache(num_blocks, BLOCK, KV_HEADS, DIM, dtype, torch.device("cpu"))
    for r in requests:
        slots = torch.tensor([r.block_ids[p // BLOCK] * BLOCK + p % BLOCK for p in range(r.num_computed_tokens)],
                             dtype=torch.long)
        write_kv(cache, full[r.request_id][1][:r.num_computed_tokens], full[r.request_id][2][:r.num_computed_tokens],
                 slots)
    batch = build_model_input([(r, r.num_tokens + len(r.spec_token_ids) - r.num_computed_tokens) for r in requests],
                              BLOCK, torch.device("cpu"))
    q, k, v = (torch.cat([full[r.request_id][i][r.num_computed_tokens:] for r in batch.requests]) for i in range(3))
    write_kv(cache, k, v, batch.attn_metadata.slot_mapping)
    return batch, (q, k, v), cache, full


def _to_device(batch, tensors, cache):
    meta = batch.attn_metadata
    for name in ("slot_mapping", "decode_block_tables", "decode_context_lens", "prefill_block_tables",
                 "prefill_token_tables", "prefill_token_lens"):
        if getattr(meta, name) is not None:  # a step of decodes alone has no prefill layout
            setattr(meta, name, getattr(meta, name).to(DEVICE))
    return meta, [t.to(DEVICE) for t in tensors], tuple(c.to(DEVICE) for c in cache)


# (tokens, computed, proposed): two fresh prefills of one length, one longer than a tile and past several key
# steps, a chunk after cached context, decodes of different lengths, and a decode verifying two proposals.
SHAPES = [(5, 0, 0), (5, 0, 0), (70, 0, 0), (9, 6, 0), (40, 3, 0), (10, 9, 0), (3, 2, 0), (37, 36, 0), (12, 11, 2)]


@pytest.mark.parametrize("shapes", [SHAPES, SHAPES[-4:], SHAPES[:3]], ids=["mixed", "decodes", "prefills"])
def test_kernel_matches_dense_causal_attention(shapes):
    batch, tensors, cache, full = _step(shapes, torch.float32)
    meta, (q, _, _), cache = _to_device(batch, tensors, cache)
    out = triton_attention.paged_attention_triton(q, cache, meta, DIM ** -0.5).cpu()
    for r, start, n in zip(batch.requests, batch.query_starts, batch.num_new_tokens):
        fq, fk, fv = (x.transpose(0, 1).unsqueeze(0) for x in full[r.request_id])
        dense = F.scaled_dot_product_attention(fq, fk, fv, is_causal=True, enable_gqa=True)[0].transpose(0, 1)
        torch.testing.assert_close(out[start:start + n], dense[r.num_computed_tokens:], atol=1e-5, rtol=1e-5)


def test_kernel_matches_reference_paged_attention_on_strided_queries():
    """q as the model passes it: a view of the merged QKV projection (rows wider than the query heads)."""
    batch, (q, k, v), cache, _ = _step(SHAPES, torch.float32)
    expected = paged_attention(q, k, v, cache, batch.attn_metadata, 0.3)
    qkv = torch.cat([q, k, v], dim=1)
    meta, (qkv,), cache = _to_device(batch, [qkv], cache)
    out = triton_attention.paged_attention_triton(qkv[:, :HEADS], cache, meta, 0.3)
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)


def test_prefill_tiles_cover_each_token_once():
    batch, _, _, _ = _step(SHAPES, torch.float32)
    meta = batch.attn_metadata
    tiles = triton_attention.prefill_tiles(meta, 16, torch.device("cpu"))
    rows, starts, sizes, first_lens = tiles.tolist()
    covered = [t for start, size in zip(starts, sizes) for t in range(start, start + size)]
    assert covered == list(range(meta.num_prefill_tokens))
    assert max(sizes) == 16
    # Each token's row and key count, as the token tables of the C kernel give them.
    token_rows = [row for row, size in zip(rows, sizes) for _ in range(size)]
    token_lens = [first + i for first, size in zip(first_lens, sizes) for i in range(size)]
    assert token_rows == meta.prefill_token_tables.tolist()
    assert token_lens == meta.prefill_token_lens.tolist()
    assert triton_attention.prefill_tiles(meta, 16, torch.device("cpu")) is tiles  # built once per step


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bfloat16 kernels need CUDA")
def test_bfloat16_kernel_stays_close_to_float32():
    batch, tensors, cache, _ = _step(SHAPES, torch.float32)
    meta, (q, _, _), cache = _to_device(batch, tensors, cache)
    expected = triton_attention.paged_attention_triton(q, cache, meta, DIM ** -0.5)
    half = triton_attention.paged_attention_triton(q.bfloat16(), tuple(c.bfloat16() for c in cache), meta,
                                                   DIM ** -0.5)
    torch.testing.assert_close(half.float(), expected, atol=3e-2, rtol=3e-2)


@pytest.mark.slow
@pytest.mark.skipif(DEVICE.type == "cuda", reason="on CUDA the engine runs the kernel anyway (tests/gpu/)")
def test_the_model_gives_the_same_output_with_the_kernel_as_with_the_c_kernel(default_model, monkeypatch):
    """The default model on CPU with its attention swapped for the Triton kernel (interpreted): the kernel as
    the model calls it, on merged-projection views and real step layouts, prefill tiles shared by the layers."""
    from pagedllm import LLM

    prompts = [{"prompt_token_ids": list(range(100, 100 + n))} for n in (7, 33)]
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=3, prompt_logprobs=2)
    llm = LLM(default_model, device="cpu", enforce_eager=True, num_gpu_blocks_override=64, block_size=16)
    expected = llm.generate(prompts, params, use_tqdm=False)
    monkeypatch.setattr(triton_attention, "serves", lambda device: True)
    prefill_tokens = []  # per call: the step's prefill tokens (0 in a decode step)
    kernel = triton_attention.paged_attention_triton
    monkeypatch.setattr(triton_attention, "paged_attention_triton",
                        lambda q, cache, meta, scale: prefill_tokens.append(meta.num_prefill_tokens) or kernel(
                            q, cache, meta, scale))
    got = llm.generate(prompts, params, use_tqdm=False)
    assert 0 in prefill_tokens and max(prefill_tokens) > 0
    for ours, want in zip(got, expected):
        assert ours.outputs[0].token_ids == want.outputs[0].token_ids
        for steps_got, steps_want in ((ours.outputs[0].logprobs, want.outputs[0].logprobs),
                                      (ours.prompt_logprobs[1:], want.prompt_logprobs[1:])):
            for step_got, step_want in zip(steps_got, steps_want):
                assert {t: p.logprob for t, p in step_got.items()} == pytest.approx(
                    {t: p.logprob for t, p in step_want.items()}, abs=1e-4)
