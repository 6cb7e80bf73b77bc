"""Steps of up to MAX_GRAPH_ROWS rows on CPU (decode rows, prefill tokens), replayed from a recording of their
kernel calls: CPU graphs.

A decode step of the default model is about 240 C kernel calls (cpu_kernels.py). At a batch of one, their
dispatch from Python took about 3 ms of a 22 ms step, more than the attention and element-wise work
themselves; replayed from C (csrc/plan.c), the same calls take microseconds of dispatch. A step with prefill
tokens replays the same way, each token a row over its sequence's blocks (the attention kernel computes a
prefill token as it computes a decode row at that position): a graph is a number of rows, whatever their mix.

As with CUDA graphs, the first step of each number of rows runs the model while recording its kernel
calls, over input buffers that the graph keeps; later steps of that size copy their inputs into those
buffers and replay the calls. A recording holds pointers, so it stays valid only while everything it points
to stays in place: the weights and KV cache (never moved once allocated) and the intermediate results, which
the recording keeps alive. A linear layer that runs PyTorch operators (on oneDNN or MKL where those were
measured fastest, or with a bias) is recorded as a step of its own (cpu_kernels.replayable), which the replay
reruns from Python between runs of kernel calls. Any other PyTorch computation, which a replay would skip, is
refused at capture, and the model then runs eagerly.

A step whose rows all take the argmax of their logits (greedy, nothing for the sampler to apply) also replays
the LM head and the argmax kernel after its graph, or the bounded greedy head that replaces both
(`DecodeGraphs.greedy`, model/greedy_head.py), so that it runs no PyTorch operator after the layers.
"""
from __future__ import annotations

import ctypes
import logging
from typing import Any, Callable, NamedTuple, Optional, Union

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from pagedllm.model.attention import AttentionMetadata, KVCache
from pagedllm.model.cpu_kernels import RecordedCall, TorchStep, in_torch_step, load_plan_runner, recording_calls
from pagedllm.worker.batch import ModelInput, cache_slot
from pagedllm.worker.graph_arena import GraphArena
from pagedllm.worker.graph_dispatch import graph_rows

logger = logging.getLogger(__name__)

# Largest step replayed, in rows: decode rows (a verification's positions each one) and prefill tokens. Dispatch
# from Python costs the same at any size, while the step's matmuls and attention grow with it; at 64 sequences of
# the default model it was still 7% of the step's CPU time, and more of its wall time, as it runs on one thread
# while the kernels run on all. Eager, a 128-token prompt's prefill spent 9-11 ms of Python around its 270 kernel
# calls; replayed, the `latency` workload's time to first token was 0.89x the eager one, and the `spec_decode`
# workload's 16 requests at once with ngram (up to 192 rows a step) took 0.95x the time with graphs up to 64 rows
# (AMD Zen 3, two threads, taking turns in one process). The graphs share one arena for their intermediate
# results (graph_arena.py): 1 MB per row of the largest graph.
MAX_GRAPH_ROWS = 128

_ALLOCATIONS = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default,
                torch.ops.aten.new_empty.default}


class CaptureRefused(Exception):
    """The forward pass ran a PyTorch computation, which a replay of its kernel calls would leave out."""


class _OnlyKernels(TorchDispatchMode):
    """Lets views, allocations and the operators of replayable steps through and refuses any other PyTorch
    operator, and a view operator (reshape, flatten) that had to copy. Given an arena, the kernels' contiguous
    CPU allocations come from it."""

    def __init__(self, arena: Optional[GraphArena] = None) -> None:
        super().__init__()
        self.arena = arena

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        if in_torch_step():
            return func(*args, **(kwargs or {}))
        if func in _ALLOCATIONS:
            return self._allocate(func, args, kwargs or {})
        if not func.is_view:
            raise CaptureRefused(f"the forward pass runs {func}")
        out = func(*args, **(kwargs or {}))
        views = out if isinstance(out, list) else [out]
        storage = args[0].untyped_storage().data_ptr() if func.is_view else None
        if storage is not None and any(view.untyped_storage().data_ptr() != storage for view in views):
            raise CaptureRefused(f"the forward pass copies in {func}")
        return out

    def _allocate(self, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
        """The allocation from the arena where it asks for a contiguous CPU tensor, else as asked."""
        if func is torch.ops.aten.empty.memory_format:
            like, shape = None, args[0]
        else:
            like = args[0]
            shape = like.shape if func is torch.ops.aten.empty_like.default else args[1]
        dtype = kwargs.get("dtype") or (like.dtype if like is not None else torch.get_default_dtype())
        device = kwargs.get("device") or (like.device if like is not None else torch.device("cpu"))
        contiguous = kwargs.get("memory_format") in (None, torch.contiguous_format, torch.preserve_format) and (
            func is not torch.ops.aten.empty_like.default or like.is_contiguous())
        if self.arena is None or torch.device(device).type != "cpu" or not contiguous or kwargs.get("pin_memory"):
            return func(*args, **kwargs)
        return self.arena.allocate(shape, dtype)


class DecodeRow(NamedTuple):
    """A decode row as plain values: the token fed, its position, and its sequence's blocks."""

    token_id: int
    position: int
    block_ids: list[int]


class DecodeGraph:
    """One step size's recorded forward pass, over input buffers of that many rows (decode rows, or prefill tokens
    and decodes: the name is from when graphs took decode steps only)."""

    def __init__(self, model: nn.Module, kv_caches: list[KVCache], run_plan: Callable, arena: GraphArena,
                 batch_size: int, max_blocks: int) -> None:
        self.model, self.kv_caches, self.run_plan, self.arena = model, kv_caches, run_plan, arena
        hidden_size = model.embed_tokens.embedding_dim
        self.input_embeds = torch.zeros(batch_size, hidden_size, dtype=model.embed_tokens.weight.dtype)
        self.positions = torch.zeros(batch_size, dtype=torch.long)
        self.meta = AttentionMetadata(
            slot_mapping=torch.zeros(batch_size, dtype=torch.long), prefill_groups=[], prefills=[],
            num_prefill_tokens=0, decode_block_tables=torch.zeros(batch_size, max_blocks, dtype=torch.long),
            decode_context_lens=torch.zeros(batch_size, dtype=torch.long))
        self._steps: Optional[list[Callable[[], None]]] = None  # runs of kernel calls and PyTorch steps
        self._output: Optional[torch.Tensor] = None
        self._greedy_steps: Optional[list[Callable[[], None]]] = None  # the LM head and argmax after a run
        self._greedy_output: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    def run(self, batch: ModelInput) -> torch.Tensor:
        """The final hidden states [B, hidden] of this step's rows (in the arena, which the next run of any
        graph over it overwrites); the first run records the calls, raising CaptureRefused where it cannot.
        Prefill tokens come first, each a row over its sequence's blocks, then the decode rows."""
        meta = batch.attn_metadata
        self.input_embeds.copy_(self.model.embed(batch.input_ids))
        self.positions.copy_(batch.positions)
        self.meta.slot_mapping.copy_(meta.slot_mapping)
        prefill = meta.num_prefill_tokens
        # Columns past a row's own table keep older ids: the kernel reads only a row's own blocks.
        if prefill:
            tables = meta.prefill_block_tables[meta.prefill_token_tables]
            self.meta.decode_block_tables[:prefill, :tables.shape[1]].copy_(tables)
            self.meta.decode_context_lens[:prefill].copy_(meta.prefill_token_lens)
        self.meta.decode_context_lens[prefill:].copy_(meta.decode_context_lens)
        self.meta.decode_block_tables[prefill:, :meta.decode_block_tables.shape[1]].copy_(meta.decode_block_tables)
        return self._replay()

    def run_rows(self, rows: list[DecodeRow], block_size: int) -> torch.Tensor:
        """As `run`, for rows of one token each given as plain values: written straight into the input
        buffers, for a caller that steps one token at a time (a draft model proposing)."""
        positions, slots, lens, tables = (buffer.numpy() for buffer in (
            self.positions, self.meta.slot_mapping, self.meta.decode_context_lens, self.meta.decode_block_tables))
        for r, (_, position, block_ids) in enumerate(rows):
            positions[r] = position
            slots[r] = cache_slot(block_ids, position, block_size)
            lens[r] = position + 1
            tables[r, :len(block_ids)] = block_ids
        self.input_embeds.copy_(self.model.embed(torch.tensor([row.token_id for row in rows])))
        return self._replay()

    def greedy(self, arena: GraphArena) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's largest logit and its token (the first index of it) for the hidden states of the last run:
        the LM head and the argmax kernel, recorded on the first call, raising CaptureRefused where they cannot
        be. Their results lie in `arena`, shared by every graph's greedy step: the next one overwrites them."""
        if self._greedy_steps is None:
            arena.restart()
            with recording_calls() as recording, _OnlyKernels(arena):
                self._greedy_output = self.model.greedy(self._output)
            self._greedy_steps = _steps(recording, self.run_plan)
        else:
            for step in self._greedy_steps:
                step()
        return self._greedy_output

    def _replay(self) -> torch.Tensor:
        if self._steps is None:
            self.arena.restart()
            with recording_calls() as recording, _OnlyKernels(self.arena):
                self._output = self.model(self.input_embeds, self.positions, self.kv_caches, self.meta)
            self._steps = _steps(recording, self.run_plan)
        else:
            for step in self._steps:
                step()
        return self._output


def _steps(recording: list[Union[RecordedCall, TorchStep]], run_plan: Callable) -> list[Callable[[], None]]:
    """The recording as steps to replay in order: each run of kernel calls as one call of plan.c, each
    PyTorch step as itself."""
    steps, calls = [], []
    for item in [*recording, None]:
        if isinstance(item, RecordedCall):
            calls.append(item)
            continue
        if calls:
            steps.append(_plan_step(calls, run_plan))
            calls = []
        if item is not None:
            steps.append(item)
    return steps


def _plan_step(calls: list[RecordedCall], run_plan: Callable) -> Callable[[], None]:
    """One call of plan.c replaying `calls`, which it keeps alive (the plan points into their arguments and
    tensors)."""
    entries = (ctypes.c_void_p * len(calls))(*(call.entry for call in calls))
    arguments = (ctypes.c_void_p * len(calls))(*(ctypes.addressof(call.words) for call in calls))

    def replay() -> None:
        run_plan(entries, arguments, len(calls))  # refers to calls: they live as long as this step

    return replay


class DecodeGraphs:
    """The graphs of a model runner's steps of up to MAX_GRAPH_ROWS rows, by number of rows, captured on first use."""

    def __init__(self, model: nn.Module, kv_caches: list[KVCache], max_model_len: int, block_size: int) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.max_blocks = -(-max_model_len // block_size)
        self.graphs: dict[int, DecodeGraph] = {}
        self.arena = GraphArena()
        self.run_plan = load_plan_runner()
        # The greedy steps' logits and argmaxes, apart from the graphs' arena: a greedy step reads its graph's
        # final hidden states, which a recording over that arena would overwrite.
        self.greedy_arena: Optional[GraphArena] = GraphArena()
        self._last: Optional[DecodeGraph] = None  # the graph that ran the last step, if one did

    def forward(self, batch: ModelInput) -> Optional[torch.Tensor]:
        """The batch's final hidden states from its graph, or None where it has none: a step of more than
        MAX_GRAPH_ROWS rows, block tables wider than max_model_len needs, prompt embeddings, or a model whose
        forward pass cannot be recorded."""
        return self._run(graph_rows(batch, MAX_GRAPH_ROWS, self.max_blocks, prefill_tokens=True),
                         lambda graph: graph.run(batch))

    def forward_rows(self, rows: list[DecodeRow], block_size: int) -> Optional[torch.Tensor]:
        """The final hidden states of these one-token decode rows, or None where no graph takes them (too many
        rows, block tables wider than max_model_len needs, or a model that cannot be recorded)."""
        fits = len(rows) <= MAX_GRAPH_ROWS and all(len(row.block_ids) <= self.max_blocks for row in rows)
        return self._run(len(rows) if fits and rows else None, lambda graph: graph.run_rows(rows, block_size))

    def greedy(self) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """Each row's largest logit and greedy token ([rows] each, on the CPU) for the final hidden states of the
        last `forward` or `forward_rows`: the LM head and the argmax replayed from a recording. The sampler's Python
        and PyTorch operators around the same two kernels, run on caches the weights have just streamed
        through, made a step at one row of the default model 0.4 ms longer (AMD Zen 4, median of 12 requests
        taking turns). None where no graph ran that step or the two cannot be recorded."""
        graph = self._last
        if graph is None or self.greedy_arena is None:
            return None
        try:
            return graph.greedy(self.greedy_arena)
        except CaptureRefused as reason:
            logger.info("Greedy rows are sampled eagerly: %s, which a CPU graph cannot replay.", reason)
            self.greedy_arena = None
            return None

    def _run(self, size: Optional[int], run: Callable[[DecodeGraph], torch.Tensor]) -> Optional[torch.Tensor]:
        self._last = None
        if self.run_plan is None or size is None:
            return None
        graph = self.graphs.get(size)
        if graph is None:
            graph = self.graphs[size] = DecodeGraph(self.model, self.kv_caches, self.run_plan, self.arena, size,
                                                        self.max_blocks)
        try:
            hidden = run(graph)
        except CaptureRefused as reason:
            # What ran before the refusal is repeated eagerly: it rewrites the same cache slots with the same keys.
            logger.info("Decode steps run eagerly: %s, which a CPU graph cannot replay.", reason)
            self.run_plan = None
            self.graphs.clear()
            self.arena = GraphArena()
            return None
        self._last = graph
        return hidden
