"""Sampling filters on the real default model, checked through the logprobs and ranks they report."""
from __future__ import annotations

import math

import pytest

from pagedllm import SamplingParams

pytestmark = pytest.mark.slow

PROMPT = "Write a short poem about the ocean:"


def tokens(llm, prompts, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def greedy_tokens(llm) -> list[int]:
    return tokens(llm, [PROMPT], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]


@pytest.mark.parametrize("filters", [{"top_k": 1}, {"min_p": 1.0}, {"top_p": 1e-6}])
def test_filters_that_leave_one_token_equal_greedy(llm, greedy_tokens, filters):
    params = SamplingParams(temperature=1.5, seed=7, max_tokens=12, ignore_eos=True, **filters)
    assert tokens(llm, [PROMPT], params)[0] == greedy_tokens


def sampled_steps(llm, **kwargs) -> list[tuple[int, dict]]:
    """(sampled token, logprobs of the step) for a seeded 24-token sample with the top 20 logprobs."""
    params = SamplingParams(max_tokens=24, ignore_eos=True, logprobs=20, **kwargs)
    completion = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    return list(zip(completion.token_ids, completion.logprobs))


def test_temperature_spreads_the_choice(llm, greedy_tokens):
    cold = sampled_steps(llm, temperature=0.2, seed=3)
    hot = sampled_steps(llm, temperature=3.0, seed=3)
    cold_ranks = [step[token].rank for token, step in cold]
    hot_ranks = [step[token].rank for token, step in hot]
    assert sum(hot_ranks) > sum(cold_ranks)
    assert max(hot_ranks) > 20  # at temperature 3 some pick falls outside the top 20
    assert sum(r == 1 for r in cold_ranks) >= 20


def test_top_k_keeps_only_the_k_most_likely(llm):
    ranks = [step[token].rank for token, step in sampled_steps(llm, temperature=3.0, top_k=3, seed=5)]
    assert max(ranks) <= 3 and max(ranks) > 1


def test_top_p_keeps_only_the_nucleus(llm):
    # At temperature 1 the reported logprobs are the distribution top-p filters.
    steps = sampled_steps(llm, temperature=1.0, top_p=0.5, seed=11)
    for token, step in steps:
        above = sum(math.exp(lp.logprob) for tid, lp in step.items() if lp.rank < step[token].rank)
        assert above < 0.5 + 1e-4
    assert any(step[token].rank > 1 for token, step in steps)


def test_min_p_drops_tokens_far_below_the_best(llm):
    steps = sampled_steps(llm, temperature=1.0, min_p=0.2, seed=13)
    for token, step in steps:
        best = max(lp.logprob for lp in step.values())
        assert step[token].logprob >= best + math.log(0.2) - 1e-4
    assert any(step[token].rank > 1 for token, step in steps)


def test_logprobs_hold_the_sampled_token_and_the_top_k_with_ranks(llm, tokenizer):
    output = llm.generate(PROMPT, SamplingParams(temperature=1.0, seed=2, max_tokens=10, ignore_eos=True,
                                                 logprobs=3, prompt_logprobs=2), use_tqdm=False)[0]
    completion = output.outputs[0]
    assert len(completion.logprobs) == len(completion.token_ids) == 10
    for token, step in zip(completion.token_ids, completion.logprobs):
        assert token in step
        top = sorted((lp for tid, lp in step.items() if lp.rank <= 3), key=lambda lp: lp.rank)
        assert [lp.rank for lp in top] == [1, 2, 3]
        assert all(a.logprob >= b.logprob for a, b in zip(top, top[1:]))
        assert len(step) == (3 if step[token].rank <= 3 else 4)
        assert all(lp.decoded_token == tokenizer.decode([tid]) for tid, lp in step.items())
    assert completion.cumulative_logprob == pytest.approx(
        sum(step[token].logprob for token, step in zip(completion.token_ids, completion.logprobs)))
    prompt_ids = output.prompt_token_ids
    assert len(output.prompt_logprobs) == len(prompt_ids) and output.prompt_logprobs[0] is None
    for token, step in zip(prompt_ids[1:], output.prompt_logprobs[1:]):
        assert token in step and len(step) in (2, 3)
        assert {lp.rank for tid, lp in step.items() if tid != token} <= {1, 2}


def test_greedy_sampled_token_has_rank_one_and_zero_logprobs_means_only_it(llm):
    completion = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=6, logprobs=0),
                              use_tqdm=False)[0].outputs[0]
    assert all(list(step) == [token] and step[token].rank == 1
               for token, step in zip(completion.token_ids, completion.logprobs))
