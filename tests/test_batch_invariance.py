"""Batch invariance on CPU: a request's tokens and logprobs are bitwise the same whether it runs alone or among
others, whatever each step's mix of prefill and decode rows and however its prompt is split into chunks.

Every row of a step is reduced in one fixed order: linear layers on the panel kernel (each output summed over
its inputs in order, whatever the number of rows), the element-wise kernels row by row, and attention for
every query token, prefill or decode, by the same kernel over the cached keys block by block."""
from __future__ import annotations

import os

import pytest
import torch

from pagedllm import SamplingParams
from pagedllm.model import cpu_kernels
from pagedllm.outputs import RequestOutput

TARGET = "Write a short poem about the sea, the wind and a small boat sailing home at dusk."
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2)


# Panels: one, five and nine (up to three rows take several neighbouring panels per tile, up to 8 for one row
# and 4 for two with AVX-512, with some left over). Rows: one tile, and several over each panel (8: two tiles
# of 4 on AVX2, whose loop takes two steps of k).
@pytest.mark.parametrize("panels", [1, 5, 9])
@pytest.mark.parametrize("rows", [2, 3, 5, 8, 19, 64, 300])
def test_panel_linear_row_is_the_same_in_any_batch(rows, panels):
    kernel = cpu_kernels.load_packed_linear()
    if kernel is None:
        pytest.skip("no C compiler built the panel kernel")
    torch.manual_seed(0)
    weight = kernel.pack(torch.randn(panels * kernel.panel, 576))
    x = torch.randn(rows, 576)
    batched = kernel.float32(x, weight)
    for row in (0, rows // 2, rows - 1):
        assert torch.equal(kernel.float32(x[row:row + 1], weight)[0], batched[row])


@pytest.mark.parametrize("rows", [1, 128, 300])
def test_panel_linear_is_the_same_on_any_number_of_threads(rows):
    """More threads than cores: threads held up by the others hand their panels over (work stealing), which
    must neither skip nor repeat a panel, nor change a result."""
    kernel = cpu_kernels.load_packed_linear()
    if kernel is None:
        pytest.skip("no C compiler built the panel kernel")
    torch.manual_seed(0)
    dense = torch.randn(40 * kernel.panel, 576)
    weight, int8_weight, scales = kernel.pack(dense), kernel.pack(dense.to(torch.int8)), torch.rand(dense.shape[0])
    x = torch.randn(rows, 576)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = kernel.float32(x, weight), kernel.int8(x, int8_weight, scales)
        torch.set_num_threads(4 * (os.cpu_count() or 1) + 1)
        for _ in range(20):
            assert torch.equal(kernel.float32(x, weight), alone[0])
            assert torch.equal(kernel.int8(x, int8_weight, scales), alone[1])
    finally:
        torch.set_num_threads(threads)


def test_attention_token_is_the_same_in_any_batch():
    """A query token's attention alone equals it among other rows (of other sequences, or its prefill's)."""
    kernel = cpu_kernels.load_attention_kernel(3, 64, 16)
    if kernel is None:
        pytest.skip("no C compiler built the attention kernel")
    torch.manual_seed(0)
    caches = [torch.randn(3, 40, 16, 64) for _ in range(2)]
    tables = torch.randperm(40).view(4, 10)
    rows = torch.tensor([0, 0, 0, 1, 2, 3, 3])  # three prefill tokens of sequence 0, then other sequences
    lens = torch.tensor([1, 2, 150, 37, 160, 16, 17])
    q = torch.randn(len(rows), 9, 64)
    batched = kernel(q, *caches, tables, lens, 0.125, rows)
    for r in range(len(rows)):
        alone = kernel(q[r:r + 1], *caches, tables[rows[r]:rows[r] + 1], lens[r:r + 1], 0.125)
        assert torch.equal(alone[0], batched[r])


def _others(count: int) -> list[str]:
    """Prompts of many lengths (some long enough to be prefilled in chunks), sharing no long prefix."""
    return [f"{i}: " + " ".join(f"word{i * 7 + j}" for j in range(3 + 9 * (i % 5))) for i in range(count)]


def _run_until(engine, request_id: str) -> RequestOutput:
    final = None
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.request_id == request_id and output.finished:
                final = output
    return final


def _summary(output: RequestOutput) -> tuple:
    completion = output.outputs[0]
    logprobs = [{token: lp.logprob for token, lp in step.items()} for step in completion.logprobs]
    prompt = [{token: lp.logprob for token, lp in step.items()} if step else None for step in output.prompt_logprobs]
    return completion.token_ids, logprobs, completion.cumulative_logprob, prompt


def _alone_and_batched(engine, target: str, num_others: int) -> tuple[tuple, tuple]:
    """The target's results run alone, then among others: half of them decoding when it arrives, the rest
    arriving with it."""
    engine.add_request("alone", target, PARAMS)
    alone = _summary(_run_until(engine, "alone"))
    others = _others(num_others)
    other_params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    half = num_others // 2
    for i, prompt in enumerate(others[:half]):
        engine.add_request(f"early-{i}", prompt, other_params)
    engine.step()
    engine.step()
    for i, prompt in enumerate(others[half:half + half // 2]):
        engine.add_request(f"late-{i}", prompt, other_params)
    engine.add_request("batched", target, PARAMS)
    for i, prompt in enumerate(others[half + half // 2:]):
        engine.add_request(f"last-{i}", prompt, other_params)
    return alone, _summary(_run_until(engine, "batched"))


def _assert_identical(alone: tuple, batched: tuple) -> None:
    assert batched[0] == alone[0]
    assert batched[1] == alone[1]  # every logprob exactly equal, not merely close
    assert batched[2] == alone[2]
    assert batched[3] == alone[3]


@pytest.mark.slow
def test_request_alone_equals_request_in_a_mixed_batch(llm):
    _assert_identical(*_alone_and_batched(llm.llm_engine, TARGET, 31))


@pytest.mark.slow
def test_chunked_prefill_splits_do_not_change_results(default_model):
    """A prompt longer than the step's token budget is prefilled in chunks: alone in two, in the batch in
    chunks cut where the other requests leave room, each chunk attending to the cached ones before it."""
    from pagedllm import LLM

    llm = LLM(default_model, enable_chunked_prefill=True, max_num_batched_tokens=32, max_num_seqs=8)
    _assert_identical(*_alone_and_batched(llm.llm_engine, TARGET * 3, 6))
