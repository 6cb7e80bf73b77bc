"""Which proposed tokens a request keeps, given the target's distribution at each proposed position.

Proposals here are single tokens (prompt lookup, or a draft model's argmax): their draft distribution is
one-hot. Rejection sampling then keeps a proposed token x with probability p(x) and, on rejection, samples
from p with x removed (renormalized), which is p's residual against the one-hot draft; when every proposal
is kept, a bonus token is sampled from the next position's p. Each emitted token is distributed exactly as
plain sampling from the target would give it.
"""
from __future__ import annotations

from typing import Optional

import torch


def accept_greedy(target_tokens: list[int], proposed: list[int]) -> list[int]:
    """The longest prefix of `proposed` equal to the target's argmax at each position (`target_tokens` has one
    more entry), followed by the target's own token at the first mismatch (or after the last proposal)."""
    num_accepted = 0
    while num_accepted < len(proposed) and proposed[num_accepted] == target_tokens[num_accepted]:
        num_accepted += 1
    return target_tokens[:num_accepted + 1]


def accept_sampled(probs: torch.Tensor, proposed: list[int], generator: Optional[torch.Generator]) -> list[int]:
    """probs [len(proposed) + 1, vocab] (each row a distribution, not necessarily normalized) -> the emitted
    tokens: the kept proposals, then one token from the residual at the first rejection or a bonus token."""
    tokens = []
    for row, token in enumerate(proposed):
        p = probs[row]
        total = p.sum()
        if torch.rand((), generator=generator, device=p.device) * total < p[token]:
            tokens.append(token)
            continue
        residual = p.clone()
        residual[token] = 0.0
        tokens.append(draw(residual, generator))
        return tokens
    tokens.append(draw(probs[len(proposed)], generator))
    return tokens


def draw(probs: torch.Tensor, generator: Optional[torch.Generator]) -> int:
    """One token from probs [vocab] (unnormalized), by the exponential race the sampler uses."""
    race = torch.empty_like(probs).exponential_(generator=generator)
    return int(probs.div(race).argmax())
