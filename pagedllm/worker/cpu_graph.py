"""Decode steps of small batches on CPU, replayed from a recording of their kernel calls: CPU graphs.

A decode step of the default model is about 240 C kernel calls (cpu_kernels.py). At a batch of one, their
dispatch from Python took about 3 ms of a 22 ms step, more than the attention and element-wise work
themselves; replayed from C (csrc/plan.c), the same calls take microseconds of dispatch.

As with CUDA graphs, the first decode step of each batch size runs the model while recording its kernel
calls, over input buffers that the graph keeps; later steps of that size copy their inputs into those
buffers and replay the calls. A recording holds pointers, so it stays valid only while everything it points
to stays in place: the weights and KV cache (never moved once allocated) and the intermediate results, which
the recording keeps alive. A forward pass that runs any PyTorch computation, which a replay would skip, is
refused at capture, and the model then runs eagerly.
"""
from __future__ import annotations

import ctypes
import logging
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from pagedllm.model.attention import AttentionMetadata, KVCache
from pagedllm.model.cpu_kernels import RecordedCall, load_plan_runner, recording_calls
from pagedllm.worker.batch import ModelInput

logger = logging.getLogger(__name__)

# Largest decode batch replayed: past it a step's matmuls and attention grow with the batch while dispatch
# does not (about 2% of a 64-sequence step), and each graph keeps its intermediate results (1 MB per
# sequence for the default model).
MAX_GRAPH_BATCH = 8

_ALLOCATIONS = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default,
                torch.ops.aten.new_empty.default}


class CaptureRefused(Exception):
    """The forward pass ran a PyTorch computation, which a replay of its kernel calls would leave out."""


class _OnlyKernels(TorchDispatchMode):
    """Lets views and allocations through and refuses any other PyTorch operator, and a view operator
    (reshape, flatten) that had to copy."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        if not (func.is_view or func in _ALLOCATIONS):
            raise CaptureRefused(f"the forward pass runs {func}")
        out = func(*args, **(kwargs or {}))
        views = out if isinstance(out, list) else [out]
        storage = args[0].untyped_storage().data_ptr() if func.is_view else None
        if storage is not None and any(view.untyped_storage().data_ptr() != storage for view in views):
            raise CaptureRefused(f"the forward pass copies in {func}")
        return out


class DecodeGraph:
    """One decode batch size's recorded forward pass, over input buffers of that size."""

    def __init__(self, model: nn.Module, kv_caches: list[KVCache], run_plan: Callable, batch_size: int,
                 max_blocks: int) -> None:
        self.model, self.kv_caches, self.run_plan = model, kv_caches, run_plan
        hidden_size = model.embed_tokens.embedding_dim
        self.input_embeds = torch.zeros(batch_size, hidden_size, dtype=model.embed_tokens.weight.dtype)
        self.positions = torch.zeros(batch_size, dtype=torch.long)
        self.meta = AttentionMetadata(
            slot_mapping=torch.zeros(batch_size, dtype=torch.long), prefill_groups=[], prefills=[],
            num_prefill_tokens=0, decode_block_tables=torch.zeros(batch_size, max_blocks, dtype=torch.long),
            decode_context_lens=torch.zeros(batch_size, dtype=torch.long))
        self._calls: list[RecordedCall] = []  # kept alive: the plan points into their arguments and tensors
        self._plan: Optional[tuple[ctypes.Array, ctypes.Array, int]] = None
        self._output: Optional[torch.Tensor] = None

    def run(self, batch: ModelInput) -> torch.Tensor:
        """The final hidden states [B, hidden] of this decode batch (a buffer that the next run overwrites);
        the first run records the calls, raising CaptureRefused where it cannot."""
        meta = batch.attn_metadata
        self.input_embeds.copy_(self.model.embed(batch.input_ids))
        self.positions.copy_(batch.positions)
        self.meta.slot_mapping.copy_(meta.slot_mapping)
        self.meta.decode_context_lens.copy_(meta.decode_context_lens)
        # Columns past this step's widest table keep older ids: the kernel reads only a row's own blocks.
        self.meta.decode_block_tables[:, :meta.decode_block_tables.shape[1]].copy_(meta.decode_block_tables)
        if self._plan is None:
            with recording_calls() as calls, _OnlyKernels():
                self._output = self.model(self.input_embeds, self.positions, self.kv_caches, self.meta)
            self._calls = calls
            self._plan = ((ctypes.c_void_p * len(calls))(*(call.entry for call in calls)),
                          (ctypes.c_void_p * len(calls))(*(ctypes.addressof(call.words) for call in calls)),
                          len(calls))
        else:
            self.run_plan(*self._plan)
        return self._output


class DecodeGraphs:
    """The graphs of a model runner's decode batches, by batch size, captured on first use."""

    def __init__(self, model: nn.Module, kv_caches: list[KVCache], max_model_len: int, block_size: int) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.max_blocks = -(-max_model_len // block_size)
        self.graphs: dict[int, DecodeGraph] = {}
        self.run_plan = load_plan_runner()

    def forward(self, batch: ModelInput) -> Optional[torch.Tensor]:
        """The batch's final hidden states from its graph, or None where it has none: prefill tokens, a
        batch above MAX_GRAPH_BATCH, block tables wider than max_model_len needs, or a model whose forward
        pass cannot be recorded."""
        meta = batch.attn_metadata
        size = meta.num_decodes
        if (self.run_plan is None or meta.num_prefill_tokens or not 0 < size <= MAX_GRAPH_BATCH
                or meta.decode_block_tables.shape[1] > self.max_blocks):
            return None
        graph = self.graphs.get(size)
        if graph is None:
            graph = self.graphs[size] = DecodeGraph(self.model, self.kv_caches, self.run_plan, size, self.max_blocks)
        try:
            return graph.run(batch)
        except CaptureRefused as reason:
            # What ran before the refusal is repeated eagerly: it rewrites the same cache slots with the same keys.
            logger.info("Decode steps run eagerly: %s, which a CPU graph cannot replay.", reason)
            self.run_plan = None
            self.graphs.clear()
            return None
