"""The decode graphs' arena: each capture's tensors apart from one another, every capture over the same memory."""
from __future__ import annotations

import torch

from pagedllm.worker.graph_arena import GraphArena


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    start = tensor.data_ptr()
    return start, start + tensor.numel() * tensor.element_size()


def test_a_capture_gets_disjoint_aligned_tensors():
    arena = GraphArena()
    tensors = [arena.allocate((3, 5), torch.float32), arena.allocate((7,), torch.long),
               arena.allocate((0,), torch.float32), arena.allocate((2, 2), torch.int32)]
    spans = sorted(_span(t) for t in tensors if t.numel())
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))
    assert all(t.data_ptr() % 64 == 0 for t in tensors)
    assert [t.shape for t in tensors] == [(3, 5), (7,), (0,), (2, 2)]


def test_each_capture_reuses_the_memory_of_the_last():
    arena = GraphArena()
    first = [arena.allocate((1000,), torch.float32) for _ in range(3)]
    arena.restart()
    second = [arena.allocate((1000,), torch.float32) for _ in range(2)]
    assert [t.data_ptr() for t in second] == [t.data_ptr() for t in first[:2]]


def test_a_tensor_larger_than_a_chunk_gets_a_chunk_of_its_own():
    arena = GraphArena()
    small = arena.allocate((16,), torch.float32)
    large = arena.allocate((5 << 20,), torch.float32)  # 20 MiB
    assert len(arena.chunks) == 2 and large.data_ptr() == arena.chunks[1].data_ptr()
    assert small.data_ptr() == arena.chunks[0].data_ptr()
