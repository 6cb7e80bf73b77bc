"""Linear layers and the embedding split over a pipeline stage's tensor-parallel ranks (Megatron's scheme, as
vLLM runs it). With one rank each holds the whole tensor and runs exactly as the plain layer.

A column-parallel layer holds some output rows of each logical projection (its heads of Q, K and V; its
share of gate and up), so its output needs no communication. A row-parallel layer holds the matching input
columns; its partial outputs are summed over the ranks by one all-reduce. The vocabulary-parallel embedding
and LM head hold a slice of the vocabulary each."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.distributed import TensorParallelGroup
from pagedllm.distributed.partition import Slice, vocab_slice
from pagedllm.model.layers import MergedLinear


class ColumnParallelLinear(MergedLinear):
    """This rank's rows of each logical projection: `row_slices` gives them per projection as (start, count)
    in its checkpoint tensor. `output_sizes` may allot a projection more rows than it loads (vocabulary
    padding), which stay zero."""

    def __init__(self, input_size: int, row_slices: Sequence[Slice], bias: bool = False,
                 output_sizes: Optional[Sequence[int]] = None) -> None:
        super().__init__(input_size, output_sizes or [count for _, count in row_slices], bias)
        self.row_slices = list(row_slices)
        if sum(self.output_sizes) > sum(count for _, count in row_slices):
            self.weight.data.zero_()

    def load_shard(self, shard: int, name: str, tensor: torch.Tensor) -> None:
        start, count = self.row_slices[shard]
        offset = sum(self.output_sizes[:shard])
        target = self.weight if name == "weight" else self.bias
        target.data[offset:offset + count].copy_(tensor[start:start + count])


class RowParallelLinear(MergedLinear):
    """This rank's input columns (start, count) of a projection; the output is summed over the ranks. The bias
    lives on TP rank 0 only, so the sum adds it once."""

    def __init__(self, input_slice: Slice, output_size: int, tp: TensorParallelGroup, bias: bool = False) -> None:
        super().__init__(input_slice[1], [output_size], bias and tp.rank == 0)
        self.input_slice, self.tp = input_slice, tp

    def load_shard(self, shard: int, name: str, tensor: torch.Tensor) -> None:
        if name == "bias":
            if self.bias is not None:
                super().load_shard(shard, name, tensor)
            return
        start, count = self.input_slice
        super().load_shard(shard, name, tensor[:, start:start + count])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(super().forward(x))


class VocabParallelEmbedding(nn.Module):
    """This rank's rows of the embedding table. Ids outside its slice look up zeros, so one all-reduce gives
    every rank the full embeddings."""

    def __init__(self, vocab_size: int, embedding_dim: int, tp: TensorParallelGroup) -> None:
        super().__init__()
        (self.vocab_start, self.vocab_count), rows = vocab_slice(vocab_size, tp.rank, tp.size)
        self.embedding_dim, self.tp = embedding_dim, tp
        self.weight = nn.Parameter(torch.zeros(rows, embedding_dim), requires_grad=False)

    def load_weight(self, tensor: torch.Tensor) -> None:
        """Copy this rank's rows of the full table [vocab, dim]."""
        start, count = self.vocab_start, self.vocab_count
        self.weight.data[:count].copy_(tensor[start:start + count])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] -> [T, dim]."""
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.vocab_count)
        embeds = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(embeds.masked_fill_(outside.unsqueeze(-1), 0))


def parallel_lm_head(vocab_size: int, hidden_size: int, tp: TensorParallelGroup) -> ColumnParallelLinear:
    """The LM head's rows of this rank's vocabulary slice, laid out as VocabParallelEmbedding's (so a tied head
    can share its table): each rank's logits then sit side by side when gathered."""
    rows_slice, rows = vocab_slice(vocab_size, tp.rank, tp.size)
    return ColumnParallelLinear(hidden_size, [rows_slice], output_sizes=[rows])
