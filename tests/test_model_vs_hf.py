"""Our model and engine against Hugging Face transformers on the same weights: greedy tokens and logprobs.

One transformers forward pass over prompt + our output gives the reference distribution at every step, given
the same prefix (the reference is teacher-forced on our tokens). Our greedy tokens equal transformers' greedy
generation token for token exactly when each of our tokens is the reference's argmax. Where the reference is
near a tie our token may be its runner-up; the comparison goes on after it, on the same prefix for both, so
every token of every request is checked.
"""
from __future__ import annotations

import pytest
import torch

from pagedllm import SamplingParams

pytestmark = pytest.mark.slow

NUM_TOKENS = 32
# A divergence is allowed only where the reference itself is this close to a tie.
TIE_MARGIN = 0.05
# Weight-only int8 moves logits by tenths: divergences from the float32 reference are allowed up to this margin.
# Every step is checked (not only the first divergence); the widest gap measured over these prompts is 0.39.
INT8_TIE_MARGIN = 0.5
# bfloat16 weights and activations (CUDA): the widest gap measured over these prompts (32 tokens each) is 0.29.
# On CPU the default model's 4-bit blocks take inputs rounded to bfloat16 (AVX512_BF16): 255 of 256 tokens measured
# were the reference's argmax, the other 0.004 below it.
BF16_TIE_MARGIN = 0.5
LOGPROB_TOLERANCE = 1e-3
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "List three colors:",
    "1, 2, 3, 4,",
    "日本の首都は",
    "Why is the sky blue? Explain it to a child in a few short sentences, please.",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def prompt_ids(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def ours(llm, prompt_ids):
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=1, prompt_logprobs=1)
    return llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)


@pytest.fixture(scope="module")
def reference(hf_model, prompt_ids, ours) -> list[torch.Tensor]:
    """Per prompt, transformers logprobs over prompt + our output."""
    return [_reference_logprobs(hf_model, ids, output.outputs[0].token_ids) for ids, output in zip(prompt_ids, ours)]


@pytest.fixture(scope="module")
def ours_int8(default_model, prompt_ids):
    from pagedllm import LLM

    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
    llm = LLM(default_model, quantization="int8")
    return llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)


@pytest.fixture(scope="module")
def bf16_llm(default_model):
    from pagedllm import LLM

    return LLM(default_model, dtype="bfloat16")


@pytest.fixture(scope="module")
def ours_bf16(bf16_llm, prompt_ids):
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
    return bf16_llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)


def _reference_logprobs(hf_model, ids: list[int], output_ids: list[int]) -> torch.Tensor:
    """[len - 1, vocab] transformers logprobs over prompt + output: row p predicts token p + 1."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids + output_ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)


def _check_greedy(index: int, got: list[int], steps: torch.Tensor, margin: float) -> None:
    """Each of our greedy tokens against the reference's distribution on the same prefix (`steps`
    [tokens, vocab]): the argmax, or a token within `margin` of it (a near tie)."""
    assert len(got) == steps.shape[0] > 0
    best = steps.max(dim=-1).values
    chosen = steps[torch.arange(len(got)), torch.tensor(got)]
    gaps = (best - chosen).tolist()
    bad = [(i, gap) for i, gap in enumerate(gaps) if gap >= margin]
    assert not bad, (f"prompt {PROMPTS[index]!r}: (token index, logprob below the reference's best) {bad}, "
                     f"not near ties (margin {margin})")


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_greedy_tokens_equal_transformers(index, ours, reference, prompt_ids):
    _check_greedy(index, ours[index].outputs[0].token_ids, reference[index][len(prompt_ids[index]) - 1:], TIE_MARGIN)


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_int8_greedy_tokens_agree_with_float32_reference(index, ours_int8, hf_model, prompt_ids):
    ids, got = prompt_ids[index], list(ours_int8[index].outputs[0].token_ids)
    _check_greedy(index, got, _reference_logprobs(hf_model, ids, got)[len(ids) - 1:], INT8_TIE_MARGIN)


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_bf16_greedy_tokens_agree_with_float32_reference(index, ours_bf16, hf_model, prompt_ids):
    ids, got = prompt_ids[index], list(ours_bf16[index].outputs[0].token_ids)
    assert len(got) == NUM_TOKENS
    _check_greedy(index, got, _reference_logprobs(hf_model, ids, got)[len(ids) - 1:], BF16_TIE_MARGIN)


def test_bf16_on_cpu_keeps_the_gguf_blocks(bf16_llm):
    """dtype=bfloat16 keeps the default model's GGUF blocks (fewer bytes than bfloat16 weights): its Q4_1 layers
    multiply inputs rounded to bfloat16 where the kernel has AVX512_BF16, its Q8_0 head keeps float32 products,
    and greedy steps keep the greedy head."""
    from pagedllm.model.cpu_kernels import load_greedy_head, load_packed_linear
    from pagedllm.model.layers import MergedLinear
    from pagedllm.model.weight_blocks import Q4_BYTES

    kernel = load_packed_linear()
    if kernel is None or kernel.blocks is None:
        pytest.skip("this build of the panel kernel has no block formats")
    model = bf16_llm.llm_engine.model_executor.worker.model_runner.model
    linears = [m for m in model.modules() if isinstance(m, MergedLinear)]
    assert linears and all(m.in_blocks for m in linears)
    four_bit = [m for m in linears if m.panel_weight.shape[2] == Q4_BYTES * kernel.panel]
    assert all(m.bfloat16_inputs == (kernel.blocks_bf16 is not None) for m in four_bit)
    eight_bit = [m for m in linears if m not in four_bit]  # the head
    assert len(eight_bit) == 1 and not eight_bit[0].bfloat16_inputs
    assert (model.greedy_head is not None) == (load_greedy_head() is not None)


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_logprobs_close_to_transformers(index, ours, reference, prompt_ids):
    ids, output, logprobs = prompt_ids[index], ours[index], reference[index]
    completion = output.outputs[0]
    positions = torch.arange(len(ids) - 1, len(ids) - 1 + NUM_TOKENS)
    expected = logprobs[positions, torch.tensor(completion.token_ids)]
    got = torch.tensor([step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids)])
    assert torch.allclose(got, expected, rtol=0, atol=LOGPROB_TOLERANCE), (got - expected).abs().max()
    assert output.prompt_logprobs[0] is None and len(output.prompt_logprobs) == len(ids)
    expected_prompt = logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    got_prompt = torch.tensor([step[token].logprob for step, token in zip(output.prompt_logprobs[1:], ids[1:])])
    assert torch.allclose(got_prompt, expected_prompt, rtol=0, atol=LOGPROB_TOLERANCE)
