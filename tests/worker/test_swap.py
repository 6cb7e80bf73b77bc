"""The swap space copies exactly the blocks it is told to, both ways."""
from __future__ import annotations

import torch

from pagedllm.model.attention import BLOCK_DIM, allocate_kv_cache
from pagedllm.worker.swap import SwapSpace


def _block(cache: torch.Tensor, block_id: int) -> torch.Tensor:
    return cache.select(BLOCK_DIM, block_id)


def test_blocks_round_trip_through_the_host():
    torch.manual_seed(0)
    caches = [allocate_kv_cache(6, 4, 2, 8, torch.float32, torch.device("cpu")) for _ in range(3)]
    for layer in caches:
        for cache in layer:
            cache.copy_(torch.randn(cache.shape))
    original = [(k.clone(), v.clone()) for k, v in caches]
    swap = SwapSpace(caches, num_blocks=4)
    swap.swap_out([(1, 3), (4, 0)])
    for k, v in caches:
        k.zero_(), v.zero_()
    swap.swap_in([(3, 5), (0, 2)])
    for layer, layer0 in zip(caches, original):
        for cache, cache0 in zip(layer, layer0):
            assert torch.equal(_block(cache, 5), _block(cache0, 1))
            assert torch.equal(_block(cache, 2), _block(cache0, 4))
            untouched = cache.index_select(BLOCK_DIM, torch.tensor([0, 1, 3, 4]))
            assert not untouched.any()
