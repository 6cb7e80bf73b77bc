"""Decode steps on CUDA replayed from CUDA graphs, one per captured batch size.

A decode step of a small model is hundreds of kernel launches of microseconds each: launched one by one from
Python the GPU waits on the host. Captured once into a torch.cuda.CUDAGraph, the step is one launch.

The graphs are captured at start, largest first and sharing one memory pool (each reuses the larger ones'
intermediates: steps never overlap), over static input buffers as wide as the largest size. A step of B decode
rows runs the graph of the smallest captured size >= B: its rows are copied into the buffers and the rows
past B are padding, which must not touch any request's cache: their token writes its keys and values to a
padding block that the scheduler never hands out (the KV cache has one block more than it knows of), and
attends to that one key. Everything a replay reads stays in place: the weights, the KV cache, the buffers.
Nothing waits for the GPU here: the step's only wait is the copy of the sampled tokens to the host.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import nn

from pagedllm.model.attention import AttentionMetadata, KVCache
from pagedllm.worker.batch import ModelInput
from pagedllm.worker.graph_dispatch import graph_rows, padded_size

logger = logging.getLogger(__name__)

# Blocks the KV cache holds past those the scheduler manages: the padding rows' target.
PADDING_BLOCKS = 1


class DecodeInputs:
    """The static inputs of the decode graphs: `max_rows` rows of token ids, positions, cache slots, context
    lengths and block tables `max_blocks` wide, on the model's device. Device-agnostic, so the padding is
    tested on CPU."""

    def __init__(self, max_rows: int, max_blocks: int, block_size: int, padding_block: int,
                 device: torch.device) -> None:
        self.padding_block = padding_block
        self.padding_slot = padding_block * block_size
        self.input_ids = torch.zeros(max_rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_rows, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((max_rows,), self.padding_slot, dtype=torch.long, device=device)
        self.context_lens = torch.ones(max_rows, dtype=torch.long, device=device)
        self.block_tables = torch.full((max_rows, max_blocks), padding_block, dtype=torch.long, device=device)

    def metadata(self, rows: int) -> AttentionMetadata:
        """Attention metadata of the first `rows` rows (views of the buffers: a graph captured over them reads
        whatever the buffers hold at replay)."""
        return AttentionMetadata(slot_mapping=self.slot_mapping[:rows], prefill_groups=[], prefills=[],
                                 num_prefill_tokens=0, decode_block_tables=self.block_tables[:rows],
                                 decode_context_lens=self.context_lens[:rows])

    def fill(self, batch: ModelInput, rows: int) -> None:
        """This decode batch's B rows, then rows B..rows as padding (a larger earlier step left its requests'
        slots there, which a replay would otherwise overwrite)."""
        meta = batch.attn_metadata
        n, width = meta.num_decodes, meta.decode_block_tables.shape[1]
        self.input_ids[:n].copy_(batch.input_ids, non_blocking=True)
        self.positions[:n].copy_(batch.positions, non_blocking=True)
        self.slot_mapping[:n].copy_(meta.slot_mapping, non_blocking=True)
        self.context_lens[:n].copy_(meta.decode_context_lens, non_blocking=True)
        # Columns past this step's widest table keep older ids: a row reads only its context's blocks.
        self.block_tables[:n, :width].copy_(meta.decode_block_tables, non_blocking=True)
        self.input_ids[n:rows].zero_()
        self.positions[n:rows].zero_()
        self.slot_mapping[n:rows].fill_(self.padding_slot)
        self.context_lens[n:rows].fill_(1)
        self.block_tables[n:rows, 0].fill_(self.padding_block)

    def forward(self, model: nn.Module, kv_caches: list[KVCache], rows: int) -> torch.Tensor:
        """The model over the first `rows` rows: final hidden states [rows, hidden]."""
        return model(model.embed(self.input_ids[:rows]), self.positions[:rows], kv_caches, self.metadata(rows))


class CudaDecodeGraphs:
    """The CUDA graphs of a model runner's decode batches, by padded batch size."""

    def __init__(self, model: nn.Module, kv_caches: list[KVCache], max_model_len: int, block_size: int,
                 sizes: list[int], padding_block: int) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = sizes
        self.max_blocks = -(-max_model_len // block_size)
        device = kv_caches[0][0].device
        self.inputs = DecodeInputs(sizes[-1], self.max_blocks, block_size, padding_block, device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first, into one memory pool (in inference mode, as steps run)."""
        pool = None
        torch.cuda.synchronize()
        for size in reversed(self.sizes):
            # One eager run first, off the capture: Triton compiles its kernel, cuBLAS picks and sets up its own.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.inputs.forward(self.model, self.kv_caches, size)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self.inputs.forward(self.model, self.kv_caches, size)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        logger.info("Captured CUDA graphs for decode batches of %s.", self.sizes)

    def forward(self, batch: ModelInput) -> Optional[torch.Tensor]:
        """The batch's final hidden states [B, hidden] (a view the next replay overwrites), or None where no
        graph takes it: prefill tokens, more rows than the largest size, block tables wider than
        max_model_len needs."""
        rows = graph_rows(batch, self.sizes[-1], self.max_blocks)
        if rows is None:
            return None
        size = padded_size(rows, self.sizes)
        self.inputs.fill(batch, size)
        self.graphs[size].replay()
        return self.outputs[size][:rows]
