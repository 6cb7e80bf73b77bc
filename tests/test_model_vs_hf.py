"""Our model and engine against Hugging Face transformers on the same weights: greedy tokens and logprobs.

One transformers forward pass over prompt + our output gives the reference distribution at every step, given
the same prefix. Our greedy tokens equal transformers' greedy generation token for token exactly when each of
our tokens is the reference's argmax; at the first step where it is not, the two generations diverge.
"""
from __future__ import annotations

import pytest
import torch

from pagedllm import SamplingParams

pytestmark = pytest.mark.slow

NUM_TOKENS = 32
# A divergence is allowed only where the reference itself is this close to a tie.
TIE_MARGIN = 0.05
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
    """Per prompt, [len - 1, vocab] transformers logprobs over prompt + our output: row p predicts token p + 1."""
    results = []
    with torch.no_grad():
        for ids, output in zip(prompt_ids, ours):
            logits = hf_model(torch.tensor([ids + output.outputs[0].token_ids])).logits[0, :-1].float()
            results.append(torch.log_softmax(logits, dim=-1))
    return results


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_greedy_tokens_equal_transformers(index, ours, reference, prompt_ids):
    got = ours[index].outputs[0].token_ids
    assert len(got) == NUM_TOKENS
    steps = reference[index][len(prompt_ids[index]) - 1:]
    expected = steps.argmax(dim=-1).tolist()
    divergence = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), None)
    if divergence is None:
        return
    top = steps[divergence].topk(2)
    gap = float(top.values[0] - top.values[1])
    assert gap < TIE_MARGIN and got[divergence] in top.indices.tolist(), (
        f"prompt {PROMPTS[index]!r}: token {divergence} is {got[divergence]}, transformers has "
        f"{expected[divergence]} with a top-two margin of {gap:.4f} (>= {TIE_MARGIN}: not a near tie)")
    pytest.skip(f"prompt {PROMPTS[index]!r} diverges from transformers at token {divergence}, where its top two "
                f"logprobs are {gap:.4f} apart: a near tie, allowed")


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
