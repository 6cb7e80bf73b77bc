"""The pool of KV cache blocks: reference counts, the queue of free blocks and the prefix-cache map.

A block whose last reference is dropped goes back to the free queue but, if it is hashed, stays findable
in the prefix cache until it is handed out again (evicted). The free queue is least recently freed first;
callers free a request's blocks deepest first, so among blocks freed together the deepest is evicted
first and the shared early blocks of a prompt live longest. Unhashed blocks hold nothing reusable and are
handed out before any cached one.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Optional

# What a full block holds: its parent's hash, its own token ids and the LoRA adapter id.
BlockKey = tuple[Optional[int], tuple[int, ...], int]


@dataclass(eq=False)
class Block:
    block_id: int
    ref_cnt: int = 0
    # Set while the block is findable in the prefix cache.
    block_hash: Optional[int] = None
    key: Optional[BlockKey] = None


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.blocks = [Block(i) for i in range(num_blocks)]
        # block id -> None, in eviction order (front first).
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[int, Block] = {}

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    def lookup(self, block_hash: int, key: BlockKey) -> Optional[Block]:
        """The cached block with this hash, if its stored tokens match too (a hash collision never hits)."""
        block = self.cached.get(block_hash)
        return block if block is not None and block.key == key else None

    def allocate(self, num_blocks: int) -> list[Block]:
        """Take `num_blocks` blocks from the front of the free queue (the caller checked there are enough)."""
        blocks = []
        for _ in range(num_blocks):
            block_id, _ = self.free_queue.popitem(last=False)
            block = self.blocks[block_id]
            self._uncache(block)
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take one more reference on each block, pulling free ones out of the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self.free_queue[block.block_id]
            block.ref_cnt += 1

    def free(self, blocks: Iterable[Block]) -> None:
        """Drop one reference on each block, in the order given (a request passes its deepest first)."""
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue[block.block_id] = None
                if block.block_hash is None:
                    self.free_queue.move_to_end(block.block_id, last=False)

    def cache(self, block: Block, block_hash: int, key: BlockKey) -> None:
        """Make a full, computed block findable; a hash already cached keeps its block."""
        if block.block_hash is None and block_hash not in self.cached:
            block.block_hash, block.key = block_hash, key
            self.cached[block_hash] = block

    def reset(self) -> bool:
        """Forget every cached block; only possible while no block is in use."""
        if self.num_free != len(self.blocks):
            return False
        for block in list(self.cached.values()):
            self._uncache(block)
        return True

    def _uncache(self, block: Block) -> None:
        if block.block_hash is not None:
            del self.cached[block.block_hash]
            block.block_hash = block.key = None
