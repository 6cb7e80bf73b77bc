"""Invariants of the KV cache manager over random sequences of allocate, append, fork, free, swap and evict."""
from __future__ import annotations

from collections import Counter

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagedllm.core.kv_cache import KVCacheManager, cdiv
from pagedllm.core.request import Request
from pagedllm.sampling_params import SamplingParams

NUM_BLOCKS, BLOCK_SIZE, NUM_SWAP_BLOCKS = 12, 4, 6
# A tiny alphabet makes shared prefixes (and so cache hits) common.
tokens = st.lists(st.integers(0, 2), min_size=1, max_size=24)


class KVCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.kv: KVCacheManager | None = None
        self.live: list[Request] = []  # holding device blocks
        self.swapped: list[Request] = []  # holding host blocks
        self.count = 0
        self.seen: list[list[int]] = []  # every prompt so far, to ask for again

    def _request(self, token_ids: list[int]) -> Request:
        self.count += 1
        return Request(f"r{self.count}", token_ids, SamplingParams(), arrival_time=0.0)

    @precondition(lambda self: self.kv is None)
    @rule(caching=st.booleans())
    def start(self, caching: bool) -> None:
        self.kv = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, watermark=0, enable_caching=caching,
                                 num_swap_blocks=NUM_SWAP_BLOCKS)

    @precondition(lambda self: self.kv is not None)
    @rule(token_ids=tokens)
    def allocate(self, token_ids: list[int]) -> None:
        self.seen.append(token_ids)
        request = self._request(token_ids)
        hit = self.kv.find_prefix(request)
        assert hit.num_tokens < request.num_tokens
        for i, block_id in enumerate(hit.block_ids):
            assert self.kv.pool.blocks[block_id].key[1] == tuple(token_ids[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE])
        if self.kv.allocate_slots(request, request.num_tokens - hit.num_tokens, hit):
            request.num_computed_tokens = request.num_tokens
            self.live.append(request)
        else:
            assert request.block_ids == []

    @precondition(lambda self: self.seen)
    @rule(data=st.data(), extra=st.lists(st.integers(0, 2), max_size=8))
    def allocate_again(self, data: st.DataObject, extra: list[int]) -> None:
        """A prompt seen before (plus a suffix): hits blocks in use or freed but not yet evicted."""
        self.allocate(data.draw(st.sampled_from(self.seen)) + extra)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), extra=tokens)
    def append(self, data: st.DataObject, extra: list[int]) -> None:
        request = data.draw(st.sampled_from(self.live))
        before = list(request.block_ids)
        for token in extra:
            request.append_output_token(token)
        if self.kv.allocate_slots(request, len(extra)):
            request.num_computed_tokens = request.num_tokens
            assert request.block_ids[:len(before)] == before
            assert len(request.block_ids) == cdiv(request.num_tokens, BLOCK_SIZE)
        else:
            assert request.block_ids == before
            del request.all_token_ids[-len(extra):], request.output_token_ids[-len(extra):]

    @precondition(lambda self: self.live)
    @rule(data=st.data(), extra=tokens)
    def fork(self, data: st.DataObject, extra: list[int]) -> None:
        parent = data.draw(st.sampled_from(self.live))
        child = self._request(parent.all_token_ids + extra)
        self.kv.fork(parent, child)
        assert child.block_ids == parent.block_ids[:len(child.block_ids)]
        if self.kv.allocate_slots(child, child.num_tokens - child.num_computed_tokens):
            child.num_computed_tokens = child.num_tokens
            self.live.append(child)
        else:
            self.kv.free(child)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        request = data.draw(st.sampled_from(self.live))
        self.live.remove(request)
        self.kv.free(request)
        assert request.block_ids == []

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def swap_out(self, data: st.DataObject) -> None:
        request = data.draw(st.sampled_from(self.live))
        device = list(request.block_ids)
        pairs = self.kv.swap_out(request)
        if pairs is None:
            assert request.block_ids == device
            return
        assert [d for d, _ in pairs] == device and request.block_ids == []
        self.live.remove(request)
        self.swapped.append(request)

    @precondition(lambda self: self.swapped)
    @rule(data=st.data())
    def swap_in(self, data: st.DataObject) -> None:
        request = data.draw(st.sampled_from(self.swapped))
        host = list(self.kv.swapped_block_ids[request.request_id])
        pairs = self.kv.swap_in(request, 0)
        if pairs is not None:
            assert [h for h, _ in pairs] == host and [d for _, d in pairs] == request.block_ids
            self.swapped.remove(request)
            self.live.append(request)

    @precondition(lambda self: self.swapped)
    @rule(data=st.data())
    def free_swapped(self, data: st.DataObject) -> None:
        request = data.draw(st.sampled_from(self.swapped))
        self.swapped.remove(request)
        self.kv.free(request)

    @precondition(lambda self: self.kv is not None)
    @rule()
    def evict_all(self) -> None:
        assert self.kv.reset_prefix_cache() == (not self.live)

    @invariant()
    def blocks_are_free_or_held_never_both(self) -> None:
        if self.kv is None:
            return
        held = Counter(b for request in self.live for b in request.block_ids)
        free = set(self.kv.pool.free_queue)
        assert not free & held.keys()
        assert free | held.keys() == set(range(NUM_BLOCKS))
        assert [block.ref_cnt for block in self.kv.pool.blocks] == [held[b] for b in range(NUM_BLOCKS)]

    @invariant()
    def cached_blocks_hold_their_tokens(self) -> None:
        if self.kv is None:
            return
        for block_hash, block in self.kv.pool.cached.items():
            assert block.block_hash == block_hash
        for request in self.live:
            for i, block_id in enumerate(request.block_ids):
                key = self.kv.pool.blocks[block_id].key
                if key is not None:
                    assert key[1] == tuple(request.all_token_ids[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE])

    @invariant()
    def host_blocks_are_free_or_held_never_both(self) -> None:
        if self.kv is None:
            return
        held = [b for request in self.swapped for b in self.kv.swapped_block_ids[request.request_id]]
        assert len(held) == len(set(held))
        assert sorted(held + list(self.kv.free_swap_blocks)) == list(range(NUM_SWAP_BLOCKS))

    def teardown(self) -> None:
        if self.kv is None:
            return
        for request in self.live + self.swapped:
            self.kv.free(request)
        assert self.kv.num_free_blocks == NUM_BLOCKS and self.kv.num_free_swap_blocks == NUM_SWAP_BLOCKS
        # Every block is reusable: one request can take them all.
        everything = self._request([7] * (NUM_BLOCKS * BLOCK_SIZE))
        assert self.kv.allocate_slots(everything, everything.num_tokens)
        assert sorted(everything.block_ids) == list(range(NUM_BLOCKS))


KVCacheMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestKVCacheInvariants = KVCacheMachine.TestCase
