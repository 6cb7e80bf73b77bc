"""Which KV cache blocks are free and which request holds which."""
from __future__ import annotations

from collections import deque

from pagedllm.core.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Hands out fixed-size blocks to requests; "no room" is a return value the scheduler answers."""

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.01) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Blocks kept free when admitting new requests, so running ones can still grow.
        self.watermark_blocks = int(watermark * num_blocks)
        self.free_block_ids: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def num_blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        total = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size)
        return max(0, total - len(request.block_ids))

    def can_ever_fit(self, num_tokens: int) -> bool:
        return cdiv(num_tokens, self.block_size) <= self.num_blocks - self.watermark_blocks

    def can_admit(self, request: Request, num_new_tokens: int) -> bool:
        """Whether a waiting request may start, leaving the watermark free."""
        need = self.num_blocks_needed(request, num_new_tokens)
        return self.num_free_blocks - need >= self.watermark_blocks

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Give `request` blocks for `num_new_tokens` more tokens; False (and no change) if there is no room."""
        need = self.num_blocks_needed(request, num_new_tokens)
        if need > self.num_free_blocks:
            return False
        request.block_ids.extend(self.free_block_ids.popleft() for _ in range(need))
        return True

    def free(self, request: Request) -> None:
        """Return all of the request's blocks, deepest first, so that its earliest blocks are reused last."""
        self.free_block_ids.extend(reversed(request.block_ids))
        request.block_ids = []
