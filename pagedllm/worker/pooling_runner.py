"""One step of a pooling model on one worker: every scheduled request runs its whole prompt, and its hidden
states are pooled into its output; nothing is sampled.

A decoder (the Llama family) runs over the paged KV cache as for generation, its blocks held only for the
step; an encoder (BERT) keeps no KV cache at all, so the scheduler's blocks for it are bookkeeping only.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import torch
from torch import nn

from pagedllm.config import EngineConfig
from pagedllm.core.runner_output import ModelRunnerOutput
from pagedllm.core.scheduler_output import SchedulerOutput
from pagedllm.distributed.partition import local_kv_cache_shape
from pagedllm.distributed.ranks import ParallelRanks
from pagedllm.model.attention import allocate_kv_cache
from pagedllm.model.pooler import pool_rows, postprocess
from pagedllm.pooling.config import is_encoder
from pagedllm.pooling_params import TOKEN_TYPE_SPLIT
from pagedllm.worker.batch import build_model_input
from pagedllm.worker.input_state import InputState, WorkerRequest
from pagedllm.worker.model_runner import CPU_TOKENS_PER_FORWARD, _split


def encoder_num_blocks(config: EngineConfig) -> int:
    """Blocks for the scheduler's bookkeeping of an encoder's requests: twice what one step can hold."""
    scheduler = config.scheduler_config
    return 2 * (scheduler.max_num_batched_tokens // config.cache_config.block_size + scheduler.max_num_seqs)


class PoolingModelRunner:
    proposer = None  # pooling requests generate nothing, so nothing is proposed (no draft cache to size)

    def __init__(self, config: EngineConfig, model: nn.Module, device: torch.device,
                 ranks: ParallelRanks = ParallelRanks()) -> None:
        self.config = config
        self.model = model
        self.device = device
        self.ranks = ranks
        self.block_size = config.cache_config.block_size
        self.pooler_config = config.model_config.pooler_config
        self.encoder = is_encoder(config.model_config.hf_config)
        self.classifier = getattr(model, "classify", None)  # a *ForSequenceClassification head
        self.kv_caches: list = []
        self.tokens_per_forward = CPU_TOKENS_PER_FORWARD if device.type == "cpu" else None
        self.input_state = InputState()

    def initialize_cache(self, num_blocks: int) -> None:
        if self.encoder:
            return
        model_config = self.config.model_config
        shape = local_kv_cache_shape(model_config.hf_config, self.ranks)
        self.kv_caches = [[allocate_kv_cache(num_blocks, self.block_size, shape.num_kv_heads, shape.head_dim,
                                             model_config.activation_dtype, self.device)
                           for _ in range(shape.num_layers)]
                          for _ in range(self.ranks.pp_size)]

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        scheduled = self.input_state.update(scheduler_output)
        pooled: dict = {}
        forward_ms = 0.0
        for part in _split(scheduled, self.tokens_per_forward):
            start = time.perf_counter()
            pooled.update(self._run(part, scheduler_output.virtual_engine))
            forward_ms += (time.perf_counter() - start) * 1000
        return ModelRunnerOutput({}, {}, {}, forward_ms, pooler_outputs=pooled)

    def _run(self, scheduled: list[tuple[WorkerRequest, int]], virtual_engine: int) -> dict:
        """One forward pass over these requests' prompts; their pooled outputs as lists."""
        for request, n in scheduled:
            if request.num_computed_tokens != 0 or n != request.num_tokens:
                raise RuntimeError(f"Pooling request {request.request_id} must run its whole prompt in one step.")
        batch = build_model_input(scheduled, self.block_size, self.device)
        if self.encoder:
            hidden = self.model(batch.input_ids, batch.positions, batch.num_new_tokens,
                                _token_type_ids(batch.requests, batch.num_new_tokens, self.device))
        else:
            hidden = self.model.forward_stage(batch.input_ids, batch.positions, self.kv_caches[virtual_engine],
                                              batch.attn_metadata)
        if hidden is None:  # a pipeline stage before the last
            return {}
        config = self.pooler_config
        pooled = pool_rows(hidden, batch.query_starts, batch.num_new_tokens,
                           [request.prompt_token_ids for request in batch.requests], config.pooling_type,
                           config.step_tag_id)
        if self.classifier is not None:
            pooled = _apply_head(self.classifier, pooled, hidden.dtype)
        # each request's PoolingParams, its task set by the engine
        return {request.request_id: postprocess(rows, request.sampling_params.task, request.sampling_params,
                                                config).tolist()
                for request, rows in zip(batch.requests, pooled)}


def _token_type_ids(requests: list[WorkerRequest], seq_lens: list[int], device: torch.device) -> Optional[torch.Tensor]:
    """[T] the token types of a step's sequences laid end to end (a pair's second text is type 1), or None
    when every token is of type 0."""
    splits = [(request.sampling_params.extra_kwargs or {}).get(TOKEN_TYPE_SPLIT) for request in requests]
    if all(split is None for split in splits):
        return None
    types = [torch.arange(n) >= (n if split is None else split) for split, n in zip(splits, seq_lens)]
    return torch.cat(types).long().to(device)


def _apply_head(classifier: Callable[[torch.Tensor], torch.Tensor], pooled: list[torch.Tensor],
                dtype: torch.dtype) -> list[torch.Tensor]:
    """Every request's pooled rows ([H] or [N, H]; MEAN pools in float32) through the classification head, in
    the model's dtype, in one call -> [labels] or [N, labels]."""
    flat = [rows.reshape(-1, rows.shape[-1]) for rows in pooled]
    logits = classifier(torch.cat(flat).to(dtype)).split([len(rows) for rows in flat])
    return [out.reshape(*rows.shape[:-1], out.shape[-1]) for rows, out in zip(pooled, logits)]
