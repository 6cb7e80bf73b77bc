"""The KV cache manager's exact block ids, reference counts and eviction order."""
from __future__ import annotations

import itertools

from pagedllm.core.block_pool import BlockPool
from pagedllm.core.kv_cache import KVCacheManager
from pagedllm.core.request import Request
from pagedllm.sampling_params import SamplingParams

_ids = itertools.count()


def make_request(tokens: list[int], lora_id: int = 0, **params) -> Request:
    lora = type("Lora", (), {"lora_int_id": lora_id})() if lora_id else None
    return Request(f"r{next(_ids)}", list(tokens), SamplingParams(**params), arrival_time=0.0, lora_request=lora)


def admit(kv: KVCacheManager, request: Request) -> list[int]:
    """What the scheduler does for a waiting request: look up, allocate the rest, compute it all."""
    hit = kv.find_prefix(request)
    assert kv.allocate_slots(request, request.num_tokens - hit.num_tokens, hit)
    request.num_computed_tokens = request.num_tokens
    return request.block_ids


def refs(kv: KVCacheManager) -> list[int]:
    return [block.ref_cnt for block in kv.pool.blocks]


def test_blocks_are_handed_out_in_order_and_freed_ones_reused_first():
    kv = KVCacheManager(num_blocks=8, block_size=4, watermark=0)
    a, b = make_request(range(10)), make_request(range(100, 105))
    assert admit(kv, a) == [0, 1, 2]
    assert admit(kv, b) == [3, 4]
    kv.free(a)
    assert a.block_ids == [] and kv.num_free_blocks == 6
    assert list(kv.pool.free_queue) == [0, 1, 2, 5, 6, 7]
    assert admit(kv, make_request(range(200, 207))) == [0, 1]


def test_growing_a_request_allocates_only_when_a_block_fills():
    kv = KVCacheManager(num_blocks=4, block_size=4, watermark=0)
    request = make_request(range(4))
    admit(kv, request)
    assert request.block_ids == [0]
    request.append_output_token(7)
    assert kv.allocate_slots(request, 1) and request.block_ids == [0, 1]
    request.num_computed_tokens += 1
    request.append_output_token(8)
    assert kv.allocate_slots(request, 1) and request.block_ids == [0, 1]
    assert not kv.allocate_slots(request, 12) and request.block_ids == [0, 1]


def test_prefix_hit_shares_full_blocks_and_counts_references():
    kv = KVCacheManager(num_blocks=8, block_size=4, watermark=0, enable_caching=True)
    first = make_request(range(10))
    assert admit(kv, first) == [0, 1, 2]
    second = make_request(list(range(8)) + [50, 51, 52])
    hit = kv.find_prefix(second)
    assert hit.block_ids == [0, 1] and hit.num_tokens == 8
    assert admit(kv, second) == [0, 1, 3]
    assert refs(kv)[:4] == [2, 2, 1, 1]
    kv.free(first)
    assert refs(kv)[:4] == [1, 1, 0, 1]
    assert kv.prefix_cache_stats.queries == 10 + 11 and kv.prefix_cache_stats.hits == 8


def test_a_fully_cached_prompt_still_computes_its_last_token():
    kv = KVCacheManager(num_blocks=8, block_size=4, watermark=0, enable_caching=True)
    admit(kv, make_request(range(8)))
    assert kv.find_prefix(make_request(range(8))).num_tokens == 4
    assert kv.find_prefix(make_request(range(9))).num_tokens == 8


def test_freed_blocks_stay_findable_until_evicted_deepest_first():
    kv = KVCacheManager(num_blocks=6, block_size=4, watermark=0, enable_caching=True)
    first = make_request(range(12))
    admit(kv, first)
    kv.free(first)
    # Free cached blocks go to the back, deepest first; never-used blocks are handed out before them.
    assert list(kv.pool.free_queue) == [3, 4, 5, 2, 1, 0]
    assert kv.find_prefix(make_request(range(13))).block_ids == [0, 1, 2]
    assert admit(kv, make_request(range(100, 116))) == [3, 4, 5, 2]
    assert kv.find_prefix(make_request(range(13))).block_ids == [0, 1]


def test_least_recently_freed_request_is_evicted_first():
    kv = KVCacheManager(num_blocks=4, block_size=4, watermark=0, enable_caching=True)
    old, new = make_request(range(8)), make_request(range(100, 108))
    admit(kv, old), admit(kv, new)
    kv.free(old)
    kv.free(new)
    assert list(kv.pool.free_queue) == [1, 0, 3, 2]
    admit(kv, make_request(range(200, 203)))  # one new block: evicts old's deepest
    assert kv.find_prefix(make_request(range(9))).block_ids == [0]
    assert kv.find_prefix(make_request(range(100, 109))).block_ids == [2, 3]


def test_a_hit_pulls_a_free_block_out_of_the_queue():
    kv = KVCacheManager(num_blocks=4, block_size=4, watermark=0, enable_caching=True)
    first = make_request(range(5))
    admit(kv, first)
    kv.free(first)
    assert list(kv.pool.free_queue) == [1, 2, 3, 0]  # the partial block holds nothing reusable
    second = make_request(range(6))
    assert admit(kv, second) == [0, 1]
    assert refs(kv) == [1, 1, 0, 0] and list(kv.pool.free_queue) == [2, 3]


def test_hash_collision_never_hits_and_lora_is_part_of_the_key():
    pool = BlockPool(2)
    pool.cache(pool.blocks[0], 123, (None, (1, 2), 0))
    assert pool.lookup(123, (None, (1, 2), 0)) is pool.blocks[0]
    assert pool.lookup(123, (None, (1, 3), 0)) is None
    kv = KVCacheManager(num_blocks=8, block_size=4, watermark=0, enable_caching=True)
    admit(kv, make_request(range(9), lora_id=1))
    assert kv.find_prefix(make_request(range(9), lora_id=2)).num_tokens == 0
    assert kv.find_prefix(make_request(range(9), lora_id=1)).num_tokens == 8


def test_prompt_logprobs_requests_skip_the_lookup():
    kv = KVCacheManager(num_blocks=8, block_size=4, watermark=0, enable_caching=True)
    admit(kv, make_request(range(9)))
    assert kv.find_prefix(make_request(range(9), prompt_logprobs=1)).num_tokens == 0


def test_reset_prefix_cache_only_when_idle():
    kv = KVCacheManager(num_blocks=4, block_size=4, watermark=0, enable_caching=True)
    request = make_request(range(9))
    admit(kv, request)
    assert not kv.reset_prefix_cache()
    kv.free(request)
    assert kv.find_prefix(make_request(range(9))).num_tokens == 8
    assert kv.reset_prefix_cache()
    assert kv.find_prefix(make_request(range(9))).num_tokens == 0 and not kv.pool.cached


def test_watermark_applies_to_admissions_only():
    kv = KVCacheManager(num_blocks=10, block_size=4, watermark=0.2)
    request = make_request(range(36))
    assert not kv.can_allocate(request, 36, reserve=True)
    assert kv.can_allocate(request, 32, reserve=True) and kv.can_allocate(request, 36)
    assert not kv.can_ever_fit(33) and kv.can_ever_fit(32)


def test_fork_shares_computed_full_blocks():
    kv = KVCacheManager(num_blocks=8, block_size=4, watermark=0)
    parent = make_request(range(10))
    admit(kv, parent)
    child = make_request(list(range(10)) + [99])
    kv.fork(parent, child)
    assert child.block_ids == [0, 1] and child.num_computed_tokens == 8
    assert kv.allocate_slots(child, 3) and child.block_ids == [0, 1, 3]
    assert refs(kv)[:4] == [2, 2, 1, 1]
    kv.free(parent)
    kv.free(child)
    assert kv.num_free_blocks == 8


def test_swap_out_and_in_move_blocks_through_host_blocks():
    kv = KVCacheManager(num_blocks=6, block_size=4, watermark=0, num_swap_blocks=3)
    request = make_request(range(10))
    admit(kv, request)
    other = make_request(range(100, 104))
    admit(kv, other)
    assert kv.swap_out(request) == [(0, 0), (1, 1), (2, 2)]
    assert request.block_ids == [] and kv.num_free_blocks == 5 and kv.num_free_swap_blocks == 0
    assert kv.swap_out(other) is None
    admit(kv, make_request(range(200, 204)))  # takes block 0
    request.append_output_token(5)
    assert kv.swap_in(request, 1) == [(0, 1), (1, 2), (2, 4)]
    assert request.block_ids == [1, 2, 4] and kv.num_free_swap_blocks == 3
    assert kv.swap_out(request) == [(1, 0), (2, 1), (4, 2)]
    kv.free(request)
    assert kv.num_free_swap_blocks == 3


def test_swap_in_waits_for_room():
    kv = KVCacheManager(num_blocks=4, block_size=4, watermark=0, num_swap_blocks=4)
    request = make_request(range(12))
    admit(kv, request)
    kv.swap_out(request)
    blocker = make_request(range(100, 108))
    admit(kv, blocker)
    assert kv.swap_in(request, 1) is None and kv.num_free_swap_blocks == 1
    kv.free(blocker)
    assert kv.swap_in(request, 1) is not None
