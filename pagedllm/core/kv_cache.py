"""Which KV cache blocks each request holds: allocation, the prefix cache, forks and swap bookkeeping.

Blocks are counted, not moved: swapping only decides which device block goes to which host block; the
worker copies them when the scheduler's output says so.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Optional

from pagedllm.core.block_pool import Block, BlockKey, BlockPool
from pagedllm.core.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class PrefixHit(NamedTuple):
    """Leading blocks of a request found in the prefix cache, the tokens they hold, and the tokens looked
    up (0 when the request was not looked up at all)."""

    block_ids: list[int]
    num_tokens: int
    num_queried: int = 0


NO_HIT = PrefixHit([], 0)


@dataclass
class PrefixCacheStats:
    """Running totals since start: requests admitted with a lookup, their tokens, and the tokens hit."""

    requests: int = 0
    queries: int = 0
    hits: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class KVCacheManager:
    """Hands out fixed-size blocks to requests; "no room" is a return value the scheduler answers."""

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.01, enable_caching: bool = False,
                 num_swap_blocks: int = 0) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        # Blocks kept free when admitting new requests, so running ones can still grow.
        self.watermark_blocks = int(watermark * num_blocks)
        self.pool = BlockPool(num_blocks)
        self.num_swap_blocks = num_swap_blocks
        self.free_swap_blocks: deque[int] = deque(range(num_swap_blocks))
        self.swapped_block_ids: dict[str, list[int]] = {}  # request id -> its host blocks, in order
        self._num_hashed: dict[str, int] = {}  # request id -> how many leading blocks were offered to the cache
        self.prefix_cache_stats = PrefixCacheStats()

    @property
    def num_free_blocks(self) -> int:
        """Free blocks, counting cached ones that nobody uses (they are evicted on demand)."""
        return self.pool.num_free

    @property
    def usage(self) -> float:
        """Fraction of blocks in use."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def can_ever_fit(self, num_tokens: int) -> bool:
        return cdiv(num_tokens, self.block_size) <= self.num_blocks - self.watermark_blocks

    # --- prefix cache -------------------------------------------------------------------------------------

    def find_prefix(self, request: Request) -> PrefixHit:
        """The request's longest cached run of full blocks, leaving at least one token to compute."""
        if not self._caches(request) or request.sampling_params.prompt_logprobs is not None:
            return NO_HIT
        hit: list[int] = []
        for i, block_hash in enumerate(self._block_hashes(request, request.num_tokens - 1)):
            block = self.pool.lookup(block_hash, self._block_key(request, i))
            if block is None:
                break
            hit.append(block.block_id)
        return PrefixHit(hit, len(hit) * self.block_size, request.num_tokens)

    def reset_prefix_cache(self) -> bool:
        """Forget all cached blocks; False (and no change) while any block is in use."""
        return self.pool.reset()

    def _caches(self, request: Request) -> bool:
        # Embedding prompts have no token ids that could name their blocks.
        return self.enable_caching and request.prompt_embeds is None

    def _block_key(self, request: Request, i: int) -> BlockKey:
        parent = request.block_hashes[i - 1] if i else None
        tokens = tuple(request.all_token_ids[i * self.block_size:(i + 1) * self.block_size])
        lora_id = getattr(request.lora_request, "lora_int_id", 0) if request.lora_request is not None else 0
        return parent, tokens, lora_id

    def _block_hashes(self, request: Request, num_tokens: int) -> list[int]:
        """Chain hashes of the full blocks among the first `num_tokens` tokens, extending the request's list."""
        num_full = num_tokens // self.block_size
        for i in range(len(request.block_hashes), num_full):
            request.block_hashes.append(hash(self._block_key(request, i)))
        return request.block_hashes[:num_full]

    def _cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Offer the blocks that are full once `num_tokens` tokens are computed to the prefix cache.

        Blocks are findable from the step that computes them: within a step every token's K/V is
        written before any attention reads the cache, so a request admitted in the same step may hit them.
        """
        if not self._caches(request):
            return
        # Proposed tokens are computed but not yet the request's: their blocks are offered once accepted.
        hashes = self._block_hashes(request, min(num_tokens, request.num_tokens))
        for i in range(self._num_hashed.get(request.request_id, 0), len(hashes)):
            self.pool.cache(self.pool.blocks[request.block_ids[i]], hashes[i], self._block_key(request, i))
        self._num_hashed[request.request_id] = len(hashes)

    # --- allocation ---------------------------------------------------------------------------------------

    def can_allocate(self, request: Request, num_new_tokens: int, hit: PrefixHit = NO_HIT,
                     reserve: bool = False, num_lookahead_tokens: int = 0) -> bool:
        """Whether `allocate_slots` would succeed; `reserve` keeps the watermark free (for admissions)."""
        total = request.num_computed_tokens + hit.num_tokens + num_new_tokens + num_lookahead_tokens
        need = max(0, cdiv(total, self.block_size) - len(request.block_ids) - len(hit.block_ids))
        # Hit blocks that sit in the free queue stop being free once taken.
        free = self.num_free_blocks - sum(1 for b in hit.block_ids if self.pool.blocks[b].ref_cnt == 0)
        return need <= free - (self.watermark_blocks if reserve else 0)

    def allocate_slots(self, request: Request, num_new_tokens: int, hit: PrefixHit = NO_HIT,
                       reserve: bool = False, num_lookahead_tokens: int = 0) -> bool:
        """Give `request` the hit blocks plus room for `num_new_tokens` more tokens after its computed ones
        (and `num_lookahead_tokens` past them, which a draft model writes); False (and no change) if there is
        no room."""
        if not self.can_allocate(request, num_new_tokens, hit, reserve, num_lookahead_tokens):
            return False
        assert not (hit.block_ids and request.block_ids), "a prefix hit is only taken by a request without blocks"
        self.pool.touch(self._blocks(hit.block_ids))
        request.block_ids.extend(hit.block_ids)
        total = request.num_computed_tokens + hit.num_tokens + num_new_tokens
        need = cdiv(total + num_lookahead_tokens, self.block_size) - len(request.block_ids)
        request.block_ids.extend(block.block_id for block in self.pool.allocate(max(0, need)))
        if hit.num_queried:
            self._record_lookup(hit)
        self._cache_full_blocks(request, total)
        return True

    def _record_lookup(self, hit: PrefixHit) -> None:
        stats = self.prefix_cache_stats
        stats.requests += 1
        stats.queries += hit.num_queried
        stats.hits += hit.num_tokens

    def fork(self, parent: Request, child: Request) -> None:
        """Let `child` (whose tokens start with the parent's) share the parent's full computed blocks.

        The child then computes only the rest, like a prefix-cache hit, so no block is ever written by two
        requests and no copy-on-write is needed.
        """
        num_tokens = min(parent.num_computed_tokens, child.num_tokens - 1) // self.block_size * self.block_size
        assert not child.block_ids and child.all_token_ids[:num_tokens] == parent.all_token_ids[:num_tokens]
        shared = parent.block_ids[:num_tokens // self.block_size]
        self.pool.touch(self._blocks(shared))
        child.block_ids = list(shared)
        child.num_computed_tokens = num_tokens

    def free_past(self, request: Request, num_tokens: int) -> None:
        """Return the blocks past those of the request's first `num_tokens` tokens: reserved for proposed tokens
        that were rejected, or for a draft's lookahead, they are allocated again when a step needs them."""
        keep = cdiv(num_tokens, self.block_size)
        if len(request.block_ids) > keep:
            self.pool.free(self._blocks(reversed(request.block_ids[keep:])))
            del request.block_ids[keep:]

    def free(self, request: Request) -> None:
        """Return all of the request's blocks (device and host), deepest first."""
        self._release(request)
        self.free_swap_blocks.extend(self.swapped_block_ids.pop(request.request_id, []))

    def _release(self, request: Request) -> None:
        self.pool.free(self._blocks(reversed(request.block_ids)))
        request.block_ids = []
        self._num_hashed.pop(request.request_id, None)

    def _blocks(self, block_ids: Iterable[int]) -> list[Block]:
        return [self.pool.blocks[b] for b in block_ids]

    # --- swap ---------------------------------------------------------------------------------------------

    @property
    def num_free_swap_blocks(self) -> int:
        return len(self.free_swap_blocks)

    @property
    def swap_usage(self) -> float:
        """Fraction of host swap blocks in use (0 without a swap space)."""
        return 1.0 - self.num_free_swap_blocks / self.num_swap_blocks if self.num_swap_blocks else 0.0

    def swap_out(self, request: Request) -> Optional[list[tuple[int, int]]]:
        """Move the request's blocks to host blocks: the (device, host) pairs to copy, or None if the swap
        space is too full. Its device blocks are freed (cached ones stay findable)."""
        if len(request.block_ids) > self.num_free_swap_blocks:
            return None
        host = [self.free_swap_blocks.popleft() for _ in request.block_ids]
        pairs = list(zip(request.block_ids, host))
        self.swapped_block_ids[request.request_id] = host
        self._release(request)
        return pairs

    def swap_in(self, request: Request, num_new_tokens: int) -> Optional[list[tuple[int, int]]]:
        """Bring a swapped-out request back with room for `num_new_tokens` more tokens: the (host, device)
        pairs to copy, or None (and no change) if the device has no room, watermark kept."""
        host = self.swapped_block_ids[request.request_id]
        total = request.num_computed_tokens + num_new_tokens
        num_blocks = max(len(host), cdiv(total, self.block_size))
        if num_blocks > self.num_free_blocks - self.watermark_blocks:
            return None
        request.block_ids = [block.block_id for block in self.pool.allocate(num_blocks)]
        del self.swapped_block_ids[request.request_id]
        self.free_swap_blocks.extend(host)
        self._cache_full_blocks(request, total)
        return list(zip(host, request.block_ids))
