"""All-reduce through shared memory, for tensor-parallel ranks on the CPUs of one machine.

A decoder layer sums its attention and its MLP outputs over the ranks: on the default model, 60 all-reduces
of a few KiB a decode step. gloo's took 1.7 ms between two processes of a 2-core machine and 3.4 ms between
three, far more than the step's own compute. Here the ranks meet in a segment of /dev/shm
(csrc/shm_all_reduce.c): each call is a copy, a wait on the others' marks, and a sum.
"""
from __future__ import annotations

import mmap
import os
import tempfile
from typing import Callable, Optional

import torch
import torch.distributed as dist

# Floats per rank's slot: a larger tensor is reduced a slot at a time (a 2048-token prefill of the default
# model, 4.7 MB, in five calls). The segment holds two slots per rank.
SLOT_FLOATS = 1 << 18
_SHM_FOLDER = "/dev/shm"
_LINE_BYTES = 64  # each rank's arrival mark, one cache line (LINE_BYTES in csrc/shm_all_reduce.c)


class SharedMemoryAllReduce:
    """The float32 sums of one tensor-parallel group whose ranks share a machine; `create` builds it where it
    can (elsewhere the group keeps gloo's all-reduce)."""

    def __init__(self, segment: mmap.mmap, rank: int, world: int, reduce: Callable[..., int],
                 timeout_s: float) -> None:
        self.segment, self.rank, self.world = segment, rank, world
        self.address = torch.frombuffer(segment, dtype=torch.uint8).data_ptr()
        self.reduce, self.timeout_s = reduce, timeout_s
        self.generation = 0

    @classmethod
    def create(cls, group: dist.ProcessGroup, rank: int, world: int, first_global_rank: int,
               timeout_s: float) -> Optional[SharedMemoryAllReduce]:
        """Collective over `group`: every rank builds it, or none does (no C compiler, no room in /dev/shm, or
        a rank that cannot open the segment rank 0 made: it runs on another machine)."""
        from pagedllm.model.cpu_kernels import load_shm_all_reduce

        reduce = load_shm_all_reduce() if os.path.isdir(_SHM_FOLDER) else None
        size = world * _LINE_BYTES + 2 * world * SLOT_FLOATS * 4
        path = [None]
        if rank == 0 and reduce is not None:
            path[0] = _allocate(size)
        dist.broadcast_object_list(path, src=first_global_rank, group=group)
        segment = _map(path[0], size) if path[0] is not None and reduce is not None else None
        mapped = [None] * world
        dist.all_gather_object(mapped, segment is not None, group=group)
        if rank == 0 and path[0] is not None:
            os.unlink(path[0])  # every rank that could has it mapped: the memory lives until the last lets go
        return cls(segment, rank, world, reduce, timeout_s) if all(mapped) else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of x over the group, in place (x float32 on CPU)."""
        flat = x if x.is_contiguous() else x.contiguous()
        count = flat.numel()
        for start in range(0, count, SLOT_FLOATS):
            self.generation += 1
            chunk = min(SLOT_FLOATS, count - start)
            late = self.reduce(self.address, self.rank, self.world, SLOT_FLOATS, self.generation,
                               flat.data_ptr() + 4 * start, chunk, self.timeout_s)
            if late >= 0:
                raise RuntimeError(f"Tensor-parallel all-reduce: rank {late} of the group did not arrive within "
                                   f"{self.timeout_s:.0f} s.")
        if flat is not x:
            x.copy_(flat)
        return x


def _allocate(size: int) -> Optional[str]:
    """A new file of `size` bytes in /dev/shm, its memory reserved now (a page that cannot be had when first
    written would kill the process); None where /dev/shm has no room or cannot be written."""
    try:
        fd, path = tempfile.mkstemp(prefix="pagedllm-all-reduce-", dir=_SHM_FOLDER)
    except OSError:
        return None
    try:
        os.posix_fallocate(fd, 0, size)
        return path
    except OSError:
        os.unlink(path)
        return None
    finally:
        os.close(fd)


def _map(path: str, size: int) -> Optional[mmap.mmap]:
    """The segment at `path`, mapped; None where this machine has no such file (or it cannot be mapped)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        return mmap.mmap(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)
