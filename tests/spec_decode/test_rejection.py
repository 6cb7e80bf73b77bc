"""Acceptance rules and prompt lookup on synthetic inputs: greedy prefix match, and rejection sampling that
keeps the target distribution (chi-squared over many draws)."""
from __future__ import annotations

import pytest
import torch

from pagedllm.spec_decode.ngram import lookup
from pagedllm.spec_decode.rejection import accept_greedy, accept_sampled


def test_greedy_keeps_the_matching_prefix_then_the_targets_token():
    assert accept_greedy([5, 6, 7, 8], [5, 6, 9]) == [5, 6, 7]
    assert accept_greedy([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]  # all kept, plus the bonus token
    assert accept_greedy([4, 6], [5]) == [4]
    assert accept_greedy([3], []) == [3]


def test_lookup_continues_the_latest_earlier_match_of_the_longest_suffix():
    tokens = [1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 7, 1, 2, 3]
    assert lookup(tokens, 3, 1, 4) == [5, 6, 7]  # "1 2 3" last seen before 5 6 7
    assert lookup(tokens, 10, 1, 4) == [5, 6, 7, 1, 2, 3]  # as far as the context goes
    assert lookup([1, 2, 3, 4], 2, 1, 4) == []  # nothing repeats
    assert lookup([7, 1, 8, 2, 8], 2, 2, 4) == []  # only a one-token match, below prompt_lookup_min
    assert lookup([7, 1, 8, 2, 8], 2, 1, 4) == [2]  # a one-token match proposes one token
    assert lookup([7, 1, 8, 2, 1, 8], 2, 1, 4) == [2, 1]  # a two-token match proposes up to num_tokens


# The chi-squared distribution with 5 degrees of freedom (6 tokens) exceeds this with probability 0.001.
CHI_SQUARED_5_DOF_P001 = 20.515


def _chi_squared(observed: torch.Tensor, expected: torch.Tensor) -> float:
    return float(((observed - expected) ** 2 / expected).sum())


def _draws(probs: torch.Tensor, proposed: list[int], n: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [accept_sampled(probs, proposed, generator) for _ in range(n)]


@pytest.mark.parametrize("proposed_token", [0, 3])  # a likely and an unlikely proposal
def test_rejection_sampling_keeps_the_target_distribution(proposed_token):
    torch.manual_seed(0)
    vocab, n = 6, 6000
    probs = torch.softmax(torch.randn(3, vocab) * 1.5, dim=-1)
    probs[0] *= 3.0  # rows need not be normalized (min-p leaves them so)
    proposed = [proposed_token, 2]
    draws = _draws(probs, proposed, n, seed=1)
    first = torch.bincount(torch.tensor([d[0] for d in draws]), minlength=vocab).double()
    expected = probs[0].double() / probs[0].sum() * n
    assert _chi_squared(first, expected) < CHI_SQUARED_5_DOF_P001
    # The second token, given the first proposal was kept: the target's second row.
    second = [d[1] for d in draws if d[0] == proposed_token]
    counts = torch.bincount(torch.tensor(second), minlength=vocab).double()
    expected = probs[1].double() / probs[1].sum() * len(second)
    assert _chi_squared(counts, expected) < CHI_SQUARED_5_DOF_P001
    # Kept proposals are at most 2, each followed by exactly one token of the target's.
    assert all(1 <= len(d) <= 3 for d in draws)


def test_seeded_rejection_sampling_is_reproducible():
    probs = torch.softmax(torch.randn(4, 50), dim=-1)
    assert _draws(probs, [1, 2, 3], 20, seed=7) == _draws(probs, [1, 2, 3], 20, seed=7)
