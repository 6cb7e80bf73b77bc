"""The KV cache manager on its own: which block ids it hands out, when it says "no room", the watermark."""
from __future__ import annotations

import pytest

from pagedllm.core.kv_cache import KVCacheManager
from pagedllm.core.request import Request
from pagedllm.sampling_params import SamplingParams


def make_request(request_id: str, num_tokens: int) -> Request:
    return Request(request_id, list(range(1, num_tokens + 1)), SamplingParams(), arrival_time=0.0)


def test_blocks_are_handed_out_in_order_and_cover_the_tokens():
    kv = KVCacheManager(num_blocks=8, block_size=16, watermark=0.0)
    a, b = make_request("a", 20), make_request("b", 16)
    assert kv.allocate_slots(a, 20)
    assert kv.allocate_slots(b, 16)
    assert a.block_ids == [0, 1]
    assert b.block_ids == [2]
    assert kv.num_free_blocks == 5
    assert kv.usage == pytest.approx(3 / 8)


def test_growing_needs_a_new_block_only_at_a_block_boundary():
    kv = KVCacheManager(num_blocks=4, block_size=16, watermark=0.0)
    request = make_request("a", 16)
    kv.allocate_slots(request, 16)
    request.num_computed_tokens = 16
    assert kv.num_blocks_needed(request, 0) == 0
    assert kv.num_blocks_needed(request, 1) == 1
    assert kv.allocate_slots(request, 1)
    assert request.block_ids == [0, 1]
    request.num_computed_tokens = 17
    assert kv.num_blocks_needed(request, 15) == 0
    assert kv.num_blocks_needed(request, 16) == 1


def test_no_room_is_a_return_value_that_changes_nothing():
    kv = KVCacheManager(num_blocks=2, block_size=16, watermark=0.0)
    a, b = make_request("a", 20), make_request("b", 5)
    assert kv.allocate_slots(a, 20)
    assert not kv.allocate_slots(b, 5)
    assert b.block_ids == []
    assert kv.num_free_blocks == 0


def test_free_returns_every_block_and_reuses_never_used_blocks_first():
    kv = KVCacheManager(num_blocks=6, block_size=16, watermark=0.0)
    a, b, c = make_request("a", 40), make_request("b", 10), make_request("c", 40)
    kv.allocate_slots(a, 40)  # [0, 1, 2]
    kv.allocate_slots(b, 10)  # [3]
    kv.free(a)
    assert a.block_ids == []
    assert kv.num_free_blocks == 5
    # The two never-used blocks come first, then a's blocks, deepest first.
    kv.allocate_slots(c, 40)
    assert c.block_ids == [4, 5, 2]
    kv.free(b)
    kv.free(c)
    assert kv.num_free_blocks == kv.num_blocks
    assert sorted(kv.free_block_ids) == list(range(6))


def test_watermark_keeps_blocks_free_for_admission_but_not_for_running_requests():
    kv = KVCacheManager(num_blocks=10, block_size=16, watermark=0.2)
    assert kv.watermark_blocks == 2
    big = make_request("big", 16 * 8)
    too_big = make_request("too_big", 16 * 8 + 1)
    assert kv.can_ever_fit(big.num_tokens)
    assert not kv.can_ever_fit(too_big.num_tokens)
    assert kv.can_admit(big, big.num_tokens)
    assert not kv.can_admit(too_big, too_big.num_tokens)
    # A running request may still take the watermark's blocks.
    assert kv.allocate_slots(too_big, too_big.num_tokens)
    assert kv.num_free_blocks == 1
