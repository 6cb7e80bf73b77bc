"""A model driven directly over the paged KV cache, whole in this process or sharded over spawned processes
(gloo on CPU), through three steps that cover every attention path: fresh prefills, a prefill chunk after
cached context, and decodes."""
from __future__ import annotations

import dataclasses
import os
import types
from typing import Any, Optional

import torch
from torch import nn

from pagedllm.core.request import Request
from pagedllm.distributed import KVCacheShape, ParallelContext, ParallelRanks, local_kv_cache_shape
from pagedllm.model.attention import allocate_kv_cache
from pagedllm.model.layers import MergedLinear
from pagedllm.model.llama import LlamaForCausalLM
from pagedllm.model.loader import iter_weights, load_model
from pagedllm.model.parallel_layers import RowParallelLinear
from pagedllm.sampling_params import SamplingParams
from pagedllm.worker.batch import build_model_input
from spawn import spawn_ranks

BLOCK_SIZE = 16
NUM_BLOCKS = 8
# Per step, how many tokens of each request run: request 0 is a 7-token prompt, request 1 a 21-token
# prompt prefilled in two chunks; then each decodes.
PROMPTS = [list(range(3, 10)), list(range(40, 82, 2))]
STEPS = [(7, 10), (1, 11), (1, 1)]
NEXT_TOKENS = [11, 23]  # appended to each request once its prompt is done


def run_steps(model: Any, kv_shape: KVCacheShape) -> Optional[torch.Tensor]:
    """Logits of every sampled position, [5, vocab] (the request that completed its tokens each step, in
    layout order), on the output rank; None on the other ranks."""
    kv_caches = [allocate_kv_cache(NUM_BLOCKS, BLOCK_SIZE, kv_shape.num_kv_heads, kv_shape.head_dim, torch.float32,
                                   torch.device("cpu")) for _ in range(kv_shape.num_layers)]
    requests = [Request(str(i), prompt, SamplingParams(), 0.0) for i, prompt in enumerate(PROMPTS)]
    requests[0].block_ids, requests[1].block_ids = [5], [2, 7]
    logits = []
    for counts in STEPS:
        scheduled = [(r, n) for r, n in zip(requests, counts)]
        batch = build_model_input(scheduled, BLOCK_SIZE, torch.device("cpu"))
        hidden = model.forward_stage(batch.input_ids, batch.positions, kv_caches, batch.attn_metadata)
        if hidden is not None:
            logits.append(model.compute_logits(hidden[batch.sample_token_indices]))
        for (request, n), token in zip(scheduled, NEXT_TOKENS):
            request.num_computed_tokens += n
            if request.num_computed_tokens == request.num_tokens:
                request.append_output_token(token)
    return None if not logits or logits[0] is None else torch.cat(logits)


def run_whole(model_config: Any) -> torch.Tensor:
    model = load_model(model_config, "cpu")
    with torch.inference_mode():
        return run_steps(model, local_kv_cache_shape(model_config.hf_config, ParallelRanks()))


def run_whole_int8_as_sharded(model_config: Any, tp_size: int) -> torch.Tensor:
    """The whole model in float32 over int8-rounded weights, rounded as tp_size ranks round them: one scale per
    output row, of each rank's input columns in a row-parallel layer. The reference for sharded int8, whose
    kernels multiply by the same values."""
    model = LlamaForCausalLM(model_config.hf_config)
    model.load_weights(iter_weights(model_config))
    if model.tie_word_embeddings:  # the embedding lookup stays float32
        model.lm_head.weight = nn.Parameter(model.lm_head.weight.data.clone(), requires_grad=False)
    for module in model.modules():
        if isinstance(module, MergedLinear):
            for weight in module.weight.data.chunk(tp_size if isinstance(module, RowParallelLinear) else 1, dim=1):
                _round_to_int8(weight)
    with torch.inference_mode():
        return run_steps(model, local_kv_cache_shape(model_config.hf_config, ParallelRanks()))


def _round_to_int8(weight: torch.Tensor) -> None:
    """Symmetric per-row int8 quantization, dequantized in place."""
    scales = weight.abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny) / 127
    weight.div_(scales).round_().mul_(scales)


def run_sharded(model_config: Any, tp_size: int, pp_size: int, out_dir: str) -> torch.Tensor:
    """The output rank's logits of the model split over tp_size * pp_size spawned processes."""
    # The config's fields as a plain namespace: unpickling a transformers config would import transformers in
    # every process, seconds each on two shared cores.
    plain = dataclasses.replace(model_config, hf_config=types.SimpleNamespace(**model_config.hf_config.to_dict()))
    spawn_ranks(_run_shard, tp_size, pp_size, plain, out_dir)
    return torch.load(os.path.join(out_dir, "logits.pt"))


def _run_shard(parallel: ParallelContext, model_config: Any, out_dir: str) -> None:
    model = load_model(model_config, "cpu", parallel)
    with torch.inference_mode():
        logits = run_steps(model, local_kv_cache_shape(model_config.hf_config, parallel.ranks))
    assert (logits is not None) == parallel.ranks.is_output_rank
    if parallel.ranks.is_output_rank:
        torch.save(logits, os.path.join(out_dir, "logits.pt"))
