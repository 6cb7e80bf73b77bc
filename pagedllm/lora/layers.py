"""The LoRA updates of one merged linear layer, one per slot, applied to each row by the slot it uses.

A merged layer computes several projections (Q, K and V; gate and up). Its slots stack every projection's A
side by side and its B block-diagonally, so that one shrink and one expand cover them all:
A [slots, in, shards * R] and B [slots, shards * R, out], with each adapter's rank padded to R
(max_lora_rank) by zeros. A step's rows are grouped by adapter once (manager.py), and every layer then runs
one batched shrink and one batched expand over the groups, however many adapters the step uses.

Under tensor parallelism the updates split like the base weights: a column-parallel layer keeps its rows of
each B, a row-parallel one its input columns of A (its partial update joins the layer's all-reduce, so the
sum over ranks is x A B).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from pagedllm.lora.peft import LoRAWeights
from pagedllm.model.cpu_kernels import replayable
from pagedllm.model.layers import MergedLinear
from pagedllm.model.parallel_layers import ColumnParallelLinear, RowParallelLinear

@dataclass
class LoRAStep:
    """This step's rows of each adapter, laid out once per step for every layer. Without LoRA rows `active`
    is False and a layer's only cost is that check. When one adapter covers every row, `whole` is its slot;
    otherwise the rows of group g (one per adapter) are `gather[g]`, padded to the largest group with
    masked-out rows, and `slots[g]` is its slot (None: every slot in order, so the stacked weights serve as
    they are)."""

    active: bool = False
    whole: Optional[int] = None
    gather: Optional[torch.Tensor] = None  # [G, n] token rows
    mask: Optional[torch.Tensor] = None  # [G, n, 1]: 1 for a real row, 0 for padding
    slots: Optional[torch.Tensor] = None  # [G]


class LoRALinear:
    """The slots of one merged layer, applied after its base product (MergedLinear.forward calls `add_to`)."""

    def __init__(self, layer: MergedLinear, step: LoRAStep, max_loras: int, max_rank: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.layer, self.step, self.max_rank = layer, step, max_rank
        num_shards = 1 if isinstance(layer, RowParallelLinear) else len(layer.output_sizes)
        width = num_shards * max_rank
        self.a = torch.zeros(max_loras, layer.input_size, width, dtype=dtype, device=device)
        self.b = torch.zeros(max_loras, width, sum(layer.output_sizes), dtype=dtype, device=device)

    def load(self, slot: int, shard: int, weights: LoRAWeights) -> None:
        """Place one projection's A [r, in] and B [out, r] (this rank's part) in `slot`."""
        a, b = weights.a, weights.b
        rank, column = a.shape[0], shard * self.max_rank
        layer = self.layer
        if isinstance(layer, RowParallelLinear):
            start, count = layer.input_slice
            a = a[:, start:start + count]
        elif isinstance(layer, ColumnParallelLinear):
            start, count = layer.row_slices[shard]
            b = b[start:start + count]
        offset = sum(layer.output_sizes[:shard])
        self.a[slot, :, column:column + rank].copy_(a.t())
        self.b[slot, column:column + rank, offset:offset + b.shape[0]].copy_(b.t())

    def clear(self, slot: int) -> None:
        self.a[slot].zero_()
        self.b[slot].zero_()

    def add_to(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y [T, out] += x [T, in] A_s B_s for each row's slot s (rows without an adapter unchanged), in place.
        A CPU graph records it as a PyTorch step, which reads the step's layout again on each replay."""
        if not self.step.active:
            return y
        return replayable(lambda: self._add(x, y))

    def _add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One batched shrink and one batched expand over the step's adapters."""
        step = self.step
        if step.whole is not None:
            return y.add_(((x.to(self.a.dtype) @ self.a[step.whole]) @ self.b[step.whole]).to(y.dtype))
        a, b = (self.a, self.b) if step.slots is None else (self.a[step.slots], self.b[step.slots])
        rows = x.to(self.a.dtype)[step.gather].mul_(step.mask)  # [G, n, in]
        delta = torch.bmm(torch.bmm(rows, a), b)  # [G, n, out]
        return y.index_add_(0, step.gather.flatten(), delta.flatten(0, 1).to(y.dtype))
