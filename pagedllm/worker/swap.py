"""Host copies of KV cache blocks, for requests preempted by swapping (`preemption_mode="swap"`)."""
from __future__ import annotations

import torch

from pagedllm.model.attention import BLOCK_DIM

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


class SwapSpace:
    """Per layer, host key and value tensors shaped like the device cache, with `num_blocks` blocks.

    The scheduler decides which block goes where; this class only copies. Pinned memory on a GPU makes
    the copies asynchronous-capable and faster; on CPU the "device" cache is host memory already.
    """

    def __init__(self, kv_caches: KVCaches, num_blocks: int) -> None:
        self.kv_caches = kv_caches
        pin = kv_caches[0][0].is_cuda
        self.host_caches: KVCaches = [
            tuple(torch.empty(_with_blocks(cache.shape, num_blocks), dtype=cache.dtype, pin_memory=pin)
                  for cache in layer)  # type: ignore[misc]
            for layer in kv_caches]

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copy device blocks to host blocks, for each (device, host) pair."""
        self._copy(self.kv_caches, self.host_caches, pairs)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copy host blocks back to device blocks, for each (host, device) pair."""
        self._copy(self.host_caches, self.kv_caches, pairs)

    @staticmethod
    def _copy(src: KVCaches, dst: KVCaches, pairs: list[tuple[int, int]]) -> None:
        if not pairs:
            return
        src_ids = torch.tensor([s for s, _ in pairs], dtype=torch.long, device=src[0][0].device)
        dst_ids = torch.tensor([d for _, d in pairs], dtype=torch.long, device=dst[0][0].device)
        for src_layer, dst_layer in zip(src, dst):
            for src_cache, dst_cache in zip(src_layer, dst_layer):
                dst_cache.index_copy_(BLOCK_DIM, dst_ids,
                                      src_cache.index_select(BLOCK_DIM, src_ids).to(dst_cache.device))


def _with_blocks(shape: torch.Size, num_blocks: int) -> tuple[int, ...]:
    """The cache shape with `num_blocks` blocks."""
    return (*shape[:BLOCK_DIM], num_blocks, *shape[BLOCK_DIM + 1:])
