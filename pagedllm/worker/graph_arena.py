"""One stretch of memory for the intermediate results of all of a model runner's CPU graphs.

A recorded step keeps every intermediate result it wrote (the replay writes to the same addresses), about
1 MB per row for the default model. Graphs run one at a time and each run's intermediates are
dead once its final hidden states are read, so every graph can place its intermediates in the same memory:
the graphs of all batch sizes together cost what the largest one needs, not the sum over the sizes. That
is what lets large decode batches replay too.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

_ALIGNMENT = 64  # bytes: a cache line, and the alignment PyTorch gives its own CPU allocations
_CHUNK_BYTES = 16 << 20


class GraphArena:
    """Chunks of memory, never freed or moved while the arena lives (recordings point into them), handed out
    in order from the first chunk again at the start of every capture."""

    def __init__(self) -> None:
        self.chunks: list[torch.Tensor] = []
        self._chunk, self._offset = 0, 0

    def restart(self) -> None:
        """A capture begins: its intermediates reuse the memory of earlier captures' ones."""
        self._chunk, self._offset = 0, 0

    def allocate(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A contiguous tensor of this shape and dtype, with undefined contents, in the arena."""
        numel = math.prod(shape)
        nbytes = max(numel * dtype.itemsize, 1)
        while True:
            if self._chunk == len(self.chunks):
                self.chunks.append(torch.empty(max(_CHUNK_BYTES, nbytes), dtype=torch.uint8))
            if self._offset + nbytes <= self.chunks[self._chunk].numel():
                break
            self._chunk, self._offset = self._chunk + 1, 0
        start = self._offset
        self._offset += -(-nbytes // _ALIGNMENT) * _ALIGNMENT
        return self.chunks[self._chunk][start:start + numel * dtype.itemsize].view(dtype).view(tuple(shape))
