"""One step on one worker: lay out the batch, run the model over the paged cache, sample."""
from __future__ import annotations

import time
from typing import Optional

import torch
from torch import nn

from pagedllm.config import EngineConfig
from pagedllm.core.runner_output import ModelRunnerOutput, TokenLogprobs
from pagedllm.core.scheduler_output import SchedulerOutput
from pagedllm.distributed.partition import local_kv_cache_shape
from pagedllm.distributed.ranks import ParallelRanks
from pagedllm.lora.manager import LoRAManager
from pagedllm.model.attention import allocate_kv_cache
from pagedllm.sample.metadata import SamplingMetadata, takes_raw_argmax
from pagedllm.sample.sampler import Sampler, SamplerOutput
from pagedllm.spec_decode.proposer import Proposer
from pagedllm.spec_decode.verify import verify_greedy, verify_proposals
from pagedllm.worker.batch import ModelInput, build_model_input
from pagedllm.worker.cpu_graph import DecodeGraphs
from pagedllm.worker.cuda_graph import PADDING_BLOCKS, CudaDecodeGraphs
from pagedllm.worker.graph_dispatch import capture_sizes, graph_kind
from pagedllm.worker.input_state import InputState, WorkerRequest
from pagedllm.worker.multi_step import run_decode_steps


# On CPU a step's tokens run in forward passes of at most this many (whole requests; one longer request
# runs alone): past it the activations outgrow the caches and every op slows, measured at 20% per token
# between passes of 2048 and of 8192 tokens. GPUs prefer one large pass.
CPU_TOKENS_PER_FORWARD = 2048


class ModelRunner:
    def __init__(self, config: EngineConfig, model: nn.Module, device: torch.device,
                 ranks: ParallelRanks = ParallelRanks()) -> None:
        self.config = config
        self.ranks = ranks
        self.model = model
        self.device = device
        self.block_size = config.cache_config.block_size
        self.vocab_size = config.model_config.vocab_size
        self.sampler = Sampler()
        # One KV cache per virtual engine (pipeline parallelism keeps a batch in flight per stage).
        self.kv_caches: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        self.generators: dict[str, torch.Generator] = {}
        self.tokens_per_forward = CPU_TOKENS_PER_FORWARD if device.type == "cpu" else None
        self.num_blocks = 0
        self.decode_graphs: Optional[DecodeGraphs | CudaDecodeGraphs] = None
        self.lora_decode_graphs: Optional[DecodeGraphs] = None  # steps with LoRA rows record their updates too
        self.input_state = InputState()
        self.proposer: Optional[Proposer] = None  # speculative decoding, on the worker that samples
        self.lora: Optional[LoRAManager] = None
        if config.lora_config is not None:
            self.lora = LoRAManager(model, config.lora_config, config.model_config.hf_config, device)

    def initialize_cache(self, num_blocks: int) -> None:
        shape = local_kv_cache_shape(self.config.model_config.hf_config, self.ranks)
        # CUDA graphs' padding rows write to blocks past the scheduler's (cuda_graph.py).
        extra = PADDING_BLOCKS if self._graph_kind() == "cuda" else 0
        self.num_blocks = num_blocks
        self.kv_caches = [[allocate_kv_cache(num_blocks + extra, self.block_size, shape.num_kv_heads,
                                             shape.head_dim, self.config.model_config.activation_dtype, self.device)
                           for _ in range(shape.num_layers)]
                          for _ in range(self.ranks.pp_size)]
        self.reset_decode_graphs()

    def _graph_kind(self) -> Optional[str]:
        model_config = self.config.model_config
        return graph_kind(self.device, model_config.activation_dtype, model_config.enforce_eager, self.ranks.world_size)

    def reset_decode_graphs(self) -> None:
        """New decode graphs over the current weights and KV cache (CPU graphs recorded on first use, CUDA
        graphs captured now); graphs hold pointers, so sleep mode calls this once the weights and the cache are
        back in new memory."""
        model_config = self.config.model_config
        self.decode_graphs = self.lora_decode_graphs = None
        kind = self._graph_kind()
        if kind == "cpu":
            self.decode_graphs = DecodeGraphs(self.model, self.kv_caches[0], model_config.max_model_len,
                                              self.block_size)
            if self.lora is not None:
                self.lora_decode_graphs = DecodeGraphs(self.model, self.kv_caches[0], model_config.max_model_len,
                                                       self.block_size)
        elif kind == "cuda":  # steps with LoRA rows run eagerly on CUDA
            sizes = capture_sizes(model_config.cuda_graph_sizes, self.config.scheduler_config.max_num_seqs)
            self.decode_graphs = CudaDecodeGraphs(self.model, self.kv_caches[0], model_config.max_model_len,
                                                  self.block_size, sizes, padding_block=self.num_blocks)
            self.decode_graphs.capture()

    def release_cache(self) -> None:
        """Drop the KV cache and the graphs that point into it (sleep mode)."""
        self.kv_caches = []
        self.decode_graphs = self.lora_decode_graphs = None
        if self.proposer is not None:
            self.proposer.release_cache()

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        for request_id in scheduler_output.finished_req_ids:
            self.generators.pop(request_id, None)
        if self.proposer is not None:
            self.proposer.forget([*scheduler_output.finished_req_ids, *scheduler_output.preempted_req_ids])
        scheduled = self.input_state.update(scheduler_output)
        merged = ModelRunnerOutput({}, {}, {})
        if not scheduled:
            return merged
        kv_caches = self.kv_caches[scheduler_output.virtual_engine]
        if scheduler_output.decode_steps:
            return run_decode_steps(lambda part: self._run(part, {}, kv_caches), [r for r, _ in scheduled],
                                    scheduler_output.decode_steps)
        forward_ms = 0.0
        for part in _split(scheduled, self.tokens_per_forward):
            output = self._run(part, scheduler_output.grammar_bitmasks, kv_caches)
            merged.sampled_token_ids.update(output.sampled_token_ids)
            merged.logprobs.update(output.logprobs)
            merged.prompt_logprobs.update(output.prompt_logprobs)
            merged.failed.update(output.failed)
            forward_ms += output.model_forward_time
        merged.model_forward_time = forward_ms
        if self.proposer is not None and scheduler_output.num_lookahead_tokens and merged.sampled_token_ids:
            merged.draft_token_ids = self._propose(merged, scheduler_output.num_lookahead_tokens)
        return merged

    def _propose(self, output: ModelRunnerOutput, num_tokens: int) -> dict[str, list[int]]:
        """The next step's proposals for the requests that sampled (the engine cuts a guided request's before
        the first token its grammar refuses)."""
        requests = self.input_state.requests
        contexts = [(requests[rid], requests[rid].all_token_ids + tokens)
                    for rid, tokens in output.sampled_token_ids.items()]
        return self.proposer.propose(contexts, num_tokens)

    def _run(self, scheduled: list[tuple[WorkerRequest, int]], grammar_bitmasks: dict,
             kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> ModelRunnerOutput:
        """One forward pass over these requests' tokens, then sampling."""
        batch = build_model_input(scheduled, self.block_size, self.device)
        start = time.perf_counter()
        uses_lora = self.lora is not None and self.lora.prepare(batch.requests, batch.num_new_tokens,
                                                                batch.query_starts)
        graphs = self.lora_decode_graphs if uses_lora else self.decode_graphs
        hidden = graphs.forward(batch) if graphs is not None else None
        if hidden is None:
            extra = {"prompt_embeds": batch.prompt_embeds} if batch.prompt_embeds is not None else {}
            hidden = self.model.forward_stage(batch.input_ids, batch.positions, kv_caches, batch.attn_metadata,
                                              **extra)
        # On CUDA this is the time to launch the pass: waiting for it here would add a host synchronisation to
        # the step, which waits for the GPU only in sampling.
        forward_ms = (time.perf_counter() - start) * 1000
        if hidden is None:  # a pipeline stage before the last: its output went to the next stage
            return ModelRunnerOutput({}, {}, {}, forward_ms)
        prompt_logprobs = self._prompt_logprobs(batch, hidden)
        sampling = [batch.requests[i] for i in batch.sample_rows]
        failed = self._make_generators(sampling)
        verifying = any(request.spec_token_ids for request in sampling)
        if sampling and all(takes_raw_argmax(request, grammar_bitmasks) for request in sampling):
            greedy = self._greedy(graphs, batch, hidden)
            if greedy is None:  # a rank of the last stage other than the output rank
                return ModelRunnerOutput({}, {}, prompt_logprobs, forward_ms)
            out = SamplerOutput(greedy[1], None, None, None, greedy[0], {})
            if verifying:
                sampled = verify_greedy(out.token_ids.tolist(), out.maxima.tolist(), sampling, failed)
                return ModelRunnerOutput(sampled, {}, prompt_logprobs, forward_ms, failed=failed)
        else:
            # Every rank of the last stage computes logits (they are gathered); only the output rank samples.
            logits = self.model.compute_logits(hidden[batch.sample_token_indices]) if sampling else None
            if logits is None:
                return ModelRunnerOutput({}, {}, prompt_logprobs, forward_ms)
            if verifying:
                sampled, logprobs = verify_proposals(logits, sampling, self.generators, self.vocab_size,
                                                     self.device, failed, grammar_bitmasks)
                return ModelRunnerOutput(sampled, logprobs, prompt_logprobs, forward_ms, failed=failed)
            meta = SamplingMetadata.build(sampling, self.generators, self.vocab_size, self.device,
                                          grammar_bitmasks)
            out = self.sampler(logits, meta)
        tokens, failed_rows = out.to_host()
        failed.update({sampling[row].request_id: why for row, why in failed_rows.items()})
        logprobs = {}
        if out.logprobs is not None:  # three transfers in all, not three per row
            ids, values, ranks = out.logprob_token_ids.tolist(), out.logprobs.tolist(), out.sampled_ranks.tolist()
            for row, request in enumerate(sampling):
                k = request.sampling_params.logprobs
                if k is not None and request.request_id not in failed:
                    logprobs[request.request_id] = TokenLogprobs([ids[row][:k + 1]], [values[row][:k + 1]],
                                                                 [ranks[row]])
        sampled = {r.request_id: [t] for r, t in zip(sampling, tokens) if r.request_id not in failed}
        return ModelRunnerOutput(sampled, logprobs, prompt_logprobs, forward_ms, failed=failed)

    def _greedy(self, graphs: Optional[DecodeGraphs | CudaDecodeGraphs], batch: ModelInput,
                hidden: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """Each sampled row's largest logit and greedy token, for a step whose rows all take the argmax of their
        logits as they come (takes_raw_argmax): from the CPU graph that ran the step where it did and every row
        is sampled (a decode, or a verified position), which replays the LM head and the argmax after it
        (DecodeGraphs.greedy); else from the model (its bounded greedy head where it has one). None on the ranks
        of the last stage other than the output rank."""
        if isinstance(graphs, DecodeGraphs) and batch.sample_token_indices.shape[0] == batch.input_ids.shape[0]:
            greedy = graphs.greedy()
            if greedy is not None:
                return greedy
        return self.model.greedy(hidden[batch.sample_token_indices])

    def _make_generators(self, requests: list[WorkerRequest]) -> dict[str, str]:
        """Seeded requests' own generators, made on their first sample; a seed torch refuses fails its
        request alone (id -> why)."""
        failed = {}
        for request in requests:
            seed = request.sampling_params.seed
            if seed is not None and request.request_id not in self.generators:
                try:
                    self.generators[request.request_id] = torch.Generator(self.device).manual_seed(seed)
                except Exception as error:
                    failed[request.request_id] = f"its seed {seed} is not usable: {error}"
        return failed

    def _prompt_logprobs(self, batch: ModelInput, hidden: torch.Tensor) -> dict[str, TokenLogprobs]:
        """Logprob of each prompt token given the ones before it, for the prompt positions of this step."""
        result = {}
        for request, n, start in zip(batch.requests, batch.num_new_tokens, batch.query_starts):
            k = request.sampling_params.prompt_logprobs
            if k is None or request.num_output_tokens > 0:
                continue
            first = request.num_computed_tokens
            # Hidden state at position p predicts token p + 1; only prompt targets count.
            last = min(first + n, request.num_prompt_tokens - 1)
            if last <= first:
                continue
            logits = self.model.compute_logits(hidden[start:start + last - first])
            if logits is None:  # a rank of the last stage other than the output rank
                continue
            logprobs = torch.log_softmax(logits, dim=-1)
            targets = torch.tensor(request.prompt_token_ids[first + 1:last + 1], device=self.device)
            actual = logprobs.gather(1, targets.unsqueeze(1))
            ranks = (logprobs > actual).sum(dim=-1) + 1
            top_values, top_ids = logprobs.topk(k, dim=-1)
            result[request.request_id] = TokenLogprobs(
                torch.cat([targets.unsqueeze(1), top_ids], 1).tolist(),
                torch.cat([actual, top_values], 1).tolist(), ranks.tolist())
        return result


def _split(scheduled: list[tuple[WorkerRequest, int]], max_tokens: Optional[int]
           ) -> list[list[tuple[WorkerRequest, int]]]:
    """Consecutive runs of requests of at most max_tokens tokens each (a longer request alone)."""
    if max_tokens is None:
        return [scheduled]
    parts: list[list[tuple[WorkerRequest, int]]] = [[]]
    count = 0
    for request, n in scheduled:
        if parts[-1] and count + n > max_tokens:
            parts.append([])
            count = 0
        parts[-1].append((request, n))
        count += n
    return parts
