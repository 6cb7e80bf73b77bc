"""The swap space copies exactly the blocks it is told to, both ways."""
from __future__ import annotations

import torch

from pagedllm.worker.swap import SwapSpace


def test_blocks_round_trip_through_the_host():
    torch.manual_seed(0)
    caches = [(torch.randn(6, 4, 2, 8), torch.randn(6, 4, 2, 8)) for _ in range(3)]
    original = [(k.clone(), v.clone()) for k, v in caches]
    swap = SwapSpace(caches, num_blocks=4)
    swap.swap_out([(1, 3), (4, 0)])
    for k, v in caches:
        k.zero_(), v.zero_()
    swap.swap_in([(3, 5), (0, 2)])
    for (k, v), (k0, v0) in zip(caches, original):
        assert torch.equal(k[5], k0[1]) and torch.equal(v[5], v0[1])
        assert torch.equal(k[2], k0[4]) and torch.equal(v[2], v0[4])
        assert not k[[0, 1, 3, 4]].any() and not v[[0, 1, 3, 4]].any()
