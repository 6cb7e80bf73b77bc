"""LLMEngine: accepts requests and advances all of them one scheduled step at a time."""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Iterable, Mapping, Optional, Union

from pagedllm.config import EngineArgs, EngineConfig
from pagedllm.core.kv_cache import KVCacheManager
from pagedllm.core.request import Request, RequestStatus
from pagedllm.core.runner_output import ModelRunnerOutput
from pagedllm.core.scheduler import Scheduler
from pagedllm.core.scheduler_output import SchedulerOutput
from pagedllm.engine.engine_compat import EngineCompatMixin, UsageContext
from pagedllm.engine.multi_step import StreamedTokens, check_multi_step_params
from pagedllm.engine.output_processor import OutputProcessor, is_client_failure
from pagedllm.engine.parallel_sampling import ParentRequest
from pagedllm.engine.pooling import check_params_kind, pooling_output, prepare_pooling_params
from pagedllm.engine.request_state import RequestState
from pagedllm.engine.sleep_mode import SleepModeMixin
from pagedllm.executor import ExecutorBase
from pagedllm.inputs import ParsedPrompt, PromptType, checked_prompt_embeds, parse_prompt
from pagedllm.lora.engine_methods import LoRAEngineMixin
from pagedllm.metrics.collector import StatsCollector
from pagedllm.metrics.loggers import StatLoggerBase
from pagedllm.metrics.setup import default_stat_loggers, request_tracer
from pagedllm.metrics.tracing import warn_tracing_disabled
from pagedllm.outputs import PoolingRequestOutput, RequestOutput
from pagedllm.pooling_params import PoolingParams
from pagedllm.sample.guided_decoding import GrammarManager, accept_token, num_grammar_tokens
from pagedllm.sampling_params import SamplingParams
from pagedllm.tokenizer import get_generation_config, get_tokenizer

logger = logging.getLogger(__name__)


class LLMEngine(EngineCompatMixin, SleepModeMixin, LoRAEngineMixin):
    def __init__(self, config: EngineConfig, executor_cls: type[ExecutorBase], log_stats: bool = True,
                 usage_context: UsageContext = UsageContext.ENGINE_CONTEXT,
                 stat_loggers: Optional[dict[str, StatLoggerBase]] = None) -> None:
        """`stat_loggers`, when given with `log_stats`, replace the default ones (log line, Prometheus)."""
        self.config = config
        self.usage_context = usage_context
        self.model_config = config.model_config
        self.log_stats = log_stats
        start = time.perf_counter()
        self.tokenizer = None if self.model_config.skip_tokenizer_init else get_tokenizer(self.model_config)
        self.generation_config = get_generation_config(self.model_config)
        self.eos_token_id = self._eos_token_id()
        self.model_executor = executor_cls(config)
        num_blocks = self.model_executor.determine_num_available_blocks()
        self.model_executor.initialize_cache(num_blocks)
        block_size = config.cache_config.block_size
        logger.info("KV cache: %d blocks of %d tokens (%d tokens). Engine ready in %.1f s.", num_blocks,
                    block_size, num_blocks * block_size, time.perf_counter() - start)
        # One scheduler per virtual engine: with pipeline parallelism each keeps a batch in flight.
        num_swap_blocks = self._num_swap_blocks()
        self.schedulers = [Scheduler(config.scheduler_config, self._kv_cache_manager(num_blocks, num_swap_blocks),
                                     virtual_engine)
                           for virtual_engine in range(config.parallel_config.pipeline_parallel_size)]
        self.output_processor = OutputProcessor(self.tokenizer, self.model_config.max_model_len)
        self.requests: dict[str, RequestState] = {}  # every unfinished request's record, by engine id
        self.parents: dict[str, ParentRequest] = {}  # unfinished n > 1 requests, by the user's id
        self.streamed_tokens = StreamedTokens()  # multi-step: later tokens' outputs, one step() each
        self._checked_loras: dict[int, str] = {}
        stop_ids = sorted(({self.eos_token_id} | self.generation_eos_ids()) - {None})
        self.grammars = GrammarManager(self.tokenizer, self.model_config.vocab_size, stop_ids)
        self._init_observability(num_blocks, stat_loggers)

    def _num_swap_blocks(self) -> int:
        """Host blocks for swapped-out requests that every worker has room for."""
        num_swap_blocks = min(self.model_executor.collective_rpc("num_swap_blocks"))
        if self.config.scheduler_config.preemption_mode == "swap" and num_swap_blocks < 1:
            raise ValueError(f"swap_space ({self.config.cache_config.swap_space} GiB) holds no KV cache block; "
                             "raise swap_space or use preemption_mode='recompute'.")
        return num_swap_blocks

    def _kv_cache_manager(self, num_blocks: int, num_swap_blocks: int) -> KVCacheManager:
        cache, scheduler = self.config.cache_config, self.config.scheduler_config
        return KVCacheManager(num_blocks, cache.block_size, scheduler.watermark,
                              enable_caching=cache.enable_prefix_caching, num_swap_blocks=num_swap_blocks)

    def _init_observability(self, num_blocks: int, stat_loggers: Optional[dict[str, StatLoggerBase]]) -> None:
        lora = self.config.lora_config
        spec = self.config.speculative_config
        self.stats = StatsCollector(self.schedulers, collect=self.log_stats, max_lora=lora.max_loras if lora else 0,
                                    num_speculative_tokens=spec.num_speculative_tokens if spec else 0)
        if not self.log_stats:
            stat_loggers = {}
        self.stat_loggers: dict[str, StatLoggerBase] = (
            dict(stat_loggers) if stat_loggers is not None else default_stat_loggers(self.config, num_blocks))
        self.tracer = request_tracer(self.config)
        if self.tracer is not None:
            self.stats.on_finished_hooks.append(self.tracer.trace)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, usage_context: UsageContext = UsageContext.ENGINE_CONTEXT,
                         stat_loggers: Optional[dict[str, StatLoggerBase]] = None) -> "LLMEngine":
        return cls.from_vllm_config(engine_args.create_engine_config(), usage_context, stat_loggers,
                                    engine_args.disable_log_stats)

    def __reduce__(self) -> Any:
        raise RuntimeError("LLMEngine should not be pickled!")

    def __del__(self) -> None:
        executor = getattr(self, "model_executor", None)
        if executor is not None:
            executor.shutdown()
        for stat_logger in getattr(self, "stat_loggers", {}).values():
            stat_logger.close()
        if getattr(self, "tracer", None) is not None:
            self.tracer.shutdown()

    # --- requests -----------------------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: PromptType, params: Union[SamplingParams, PoolingParams],
                    arrival_time: Optional[float] = None, lora_request: Any = None,
                    tokenization_kwargs: Optional[dict[str, Any]] = None,
                    trace_headers: Optional[Mapping[str, str]] = None, priority: int = 0) -> None:
        """Validate and queue a request; a bad request raises ValueError (or TypeError) and changes nothing."""
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a string, got {type(request_id).__name__}.")
        self._check_awake()
        if request_id in self.requests or request_id in self.parents:
            raise ValueError(f"Request id {request_id!r} is already in use by an unfinished request.")
        check_params_kind(params, self.model_config)
        check_multi_step_params(params, self.config.scheduler_config)
        if lora_request is not None:
            self.check_lora_request(lora_request)
        if priority != 0 and self.config.scheduler_config.policy != "priority":
            raise ValueError(f"Got priority {priority} but Priority scheduling is not enabled.")
        text, token_ids, embeds, token_type_ids = self._parse_prompt(prompt, tokenization_kwargs)
        if isinstance(params, PoolingParams):
            if embeds is not None:
                raise ValueError("Prompt embeddings are not supported by pooling requests; pass text or token ids.")
            params = prepare_pooling_params(params, token_ids, self.model_config,
                                            self.config.scheduler_config.max_num_batched_tokens, token_type_ids)
        else:
            if token_type_ids is not None:
                raise ValueError("token_type_ids are read only by encoder models (BERT) run with a pooling task; "
                                 "this model generates text and takes no token types.")
            params = self._prepare_params(params, token_ids)
            if embeds is not None:
                embeds = self._embeds_params(embeds, params, len(token_ids))
        if trace_headers and self.tracer is None:
            warn_tracing_disabled()
        if getattr(params, "guided_decoding", None) is not None:
            self.grammars.compile(params.guided_decoding)  # an invalid schema fails here, before queueing
        parent = (ParentRequest(request_id, params)
                  if isinstance(params, SamplingParams) and ParentRequest.needed(params) else None)
        children = parent.children() if parent is not None else [(0, request_id, params)]
        for index, child_id, child_params in children:
            request = Request(child_id, list(token_ids), child_params, arrival_time or time.time(),
                              self.eos_token_id, priority, lora_request, prompt_embeds=embeds,
                              trace_headers=trace_headers if self.tracer else None)
            guided = getattr(child_params, "guided_decoding", None)
            virtual_engine = min(range(len(self.schedulers)),
                                 key=lambda ve: self.schedulers[ve].get_num_unfinished_requests())
            self.requests[child_id] = RequestState(
                request, text, self.tokenizer, (parent, index) if parent is not None else None,
                self.grammars.matcher(guided) if guided is not None else None, virtual_engine)
            self.schedulers[virtual_engine].add_request(request)
        if parent is not None:
            self.parents[request_id] = parent

    def _parse_prompt(self, prompt: PromptType, tokenization_kwargs: Optional[dict[str, Any]]) -> ParsedPrompt:
        """The prompt with its token ids always set (tokenized from its text if need be) and its embeddings
        checked (then the token ids are placeholders, 0 per position: the scheduler counts them, the prefix
        cache skips such requests)."""
        parsed = parse_prompt(prompt)
        if parsed.embeds is not None:
            embeds = checked_prompt_embeds(parsed.embeds, self.model_config.hf_config.hidden_size,
                                           self.model_config.enable_prompt_embeds)
            return parsed._replace(token_ids=[0] * embeds.shape[0], embeds=embeds)
        if parsed.token_ids is None:
            if self.tokenizer is None:
                raise ValueError("A text prompt needs the tokenizer, but skip_tokenizer_init=True; "
                                 "pass prompt_token_ids instead.")
            return parsed._replace(token_ids=self.tokenizer.encode(parsed.text, **(tokenization_kwargs or {})))
        return parsed

    @staticmethod
    def _embeds_params(embeds: Any, params: SamplingParams, num_tokens: int) -> Any:
        """The embeddings kept after truncate_prompt_tokens; what reads prompt token ids is refused."""
        if params.prompt_logprobs is not None:
            raise ValueError("prompt_logprobs cannot be computed for a prompt given as prompt_embeds.")
        if params.repetition_penalty != 1:
            raise ValueError("repetition_penalty cannot be applied to a prompt given as prompt_embeds.")
        return embeds[-num_tokens:]

    def _prepare_params(self, params: SamplingParams, token_ids: list[int]) -> SamplingParams:
        """Check the prompt against the model and fill the engine-derived parts of a copy of `params`."""
        max_logprobs = self.model_config.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > max_logprobs:
                raise ValueError(f"Cannot request more than {max_logprobs} logprobs.")
        params = params.clone()
        if params.truncate_prompt_tokens is not None:
            del token_ids[:-params.truncate_prompt_tokens]
        if not token_ids:
            raise ValueError("The decoder prompt cannot be empty")
        vocab_size = self.model_config.vocab_size
        for token_id in token_ids:
            if not 0 <= token_id < vocab_size:
                raise ValueError(f"Token id {token_id} is out of vocabulary")
        max_len = self.model_config.max_model_len
        if len(token_ids) > max_len:
            raise ValueError(
                f"The decoder prompt (length {len(token_ids)}) is longer than the maximum model length of "
                f"{max_len}. Make sure that `max_model_len` is no smaller than the number of text tokens.")
        if not params.ignore_eos:
            params.all_stop_token_ids.update(self.generation_eos_ids())
        self._check_token_ids(params)
        if params.bad_words and self.tokenizer is not None:
            params.update_from_tokenizer(self.tokenizer)
        if params.max_tokens is None:
            params.max_tokens = max_len - len(token_ids)
        return params

    def _check_token_ids(self, params: SamplingParams) -> None:
        vocab_size = self.model_config.vocab_size
        for name, ids in (("allowed_token_ids", params.allowed_token_ids or []),
                          ("logit_bias", list(params.logit_bias or {}))):
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"{name} contains out-of-vocab token ids {bad} (vocabulary size {vocab_size}).")

    def _eos_token_id(self) -> Optional[int]:
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            return self.tokenizer.eos_token_id
        eos = getattr(self.model_config.hf_config, "eos_token_id", None)
        return eos[0] if isinstance(eos, list) else eos

    def generation_eos_ids(self) -> set[int]:
        """EOS ids of the generation config beyond the tokenizer's, which act as stop tokens."""
        eos = getattr(self.generation_config, "eos_token_id", None) if self.generation_config else None
        ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        ids.discard(self.eos_token_id)
        return ids

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation-config defaults (temperature, top_p, ...)."""
        if self.generation_config is None:
            return SamplingParams()
        defaults = self.generation_config.to_diff_dict()
        names = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                 "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
        return SamplingParams(**{ours: defaults[theirs] for theirs, ours in names.items() if theirs in defaults})

    def abort_request(self, request_id: Union[str, Iterable[str]]) -> None:
        """Abort requests by the ids they were added with (an n > 1 request with all its samples)."""
        given = [request_id] if isinstance(request_id, str) else list(request_id)
        ids = []
        for user_id in given:
            parent = self.parents.get(user_id)
            ids.extend([parent.child_id(i) for i in range(parent.num_children)] if parent else [user_id])
        self.streamed_tokens.drop(given)
        self._finish_requests(ids, RequestStatus.FINISHED_ABORTED)

    def _finish_requests(self, request_ids: list[str], status: RequestStatus) -> None:
        """The one place where requests finish: the scheduler frees their blocks (unless it finished them
        itself), their records go, finished ones are counted and traced, aborted and failed ones are not."""
        for request_id in request_ids:
            state = self.requests.pop(request_id, None)
            if state is None:
                continue
            if status == RequestStatus.FINISHED_ERROR:
                reason = state.request.stop_reason
                log = logger.warning if is_client_failure(reason) else logger.error
                log("Request %s failed alone, the others go on: %s", request_id, reason)
            self.schedulers[state.virtual_engine].finish_requests([request_id], status)
            if state.parent is not None:
                parent = state.parent[0]
                if status == RequestStatus.FINISHED_ABORTED or parent.finished:
                    self.parents.pop(parent.request_id, None)
            if status not in (RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR):
                self.stats.on_finished(state.request, state.metrics)

    @property
    def scheduler(self) -> Scheduler:
        """The first virtual engine's scheduler: the only one without pipeline parallelism."""
        return self.schedulers[0]

    def has_unfinished_requests(self) -> bool:
        return bool(self.streamed_tokens) or any(scheduler.has_unfinished_requests() for scheduler in self.schedulers)

    def has_unfinished_requests_for_virtual_engine(self, virtual_engine: int) -> bool:
        return self.schedulers[virtual_engine].has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return sum(scheduler.get_num_unfinished_requests() for scheduler in self.schedulers)

    # --- the step -----------------------------------------------------------------------------------------

    def step(self) -> list[Union[RequestOutput, PoolingRequestOutput]]:
        """Schedule, execute, update: the outputs of this iteration. Every virtual engine's step is started
        before any is waited for, so that pipeline stages work on different batches at once. While a multi-step
        group's later tokens have outputs to stream, each step returns the next token's instead."""
        if self.streamed_tokens:
            self.do_log_stats()
            return self.streamed_tokens.next()
        outputs, started = [], []
        for scheduler in self.schedulers:
            scheduler_output, scheduled, failed = self._schedule(scheduler, outputs)
            if scheduler_output.has_work_for_workers:
                started.append((scheduler_output, scheduled, failed, time.perf_counter(),
                                self.model_executor.execute_model_async(scheduler_output)))
        for scheduler_output, scheduled, failed, start, wait in started:
            outputs += self._update(scheduler_output, scheduled, wait(), time.perf_counter() - start, failed)
        self.do_log_stats()
        return outputs

    def _schedule(self, scheduler: Scheduler, outputs: list[RequestOutput]
                  ) -> tuple[SchedulerOutput, list[RequestState], dict[str, str]]:
        """One virtual engine's plan with the grammar masks its sampling rows need, the records of its
        scheduled requests and those whose grammar failed (id -> why; they fail after the step); requests
        that can never fit are finished into `outputs`."""
        start = time.perf_counter()
        scheduler_output = scheduler.schedule()
        scheduled = [self.requests[rid] for rid in scheduler_output.num_scheduled_tokens]
        # Finished ids the engine still holds records of were finished by the scheduler, as never fitting;
        # unless the record is a new request that reuses the id of one finished since the last step.
        ignored = [self.requests[rid] for rid in scheduler_output.finished_req_ids if rid in self.requests
                   and self.requests[rid].request.status == RequestStatus.FINISHED_IGNORED]
        self.stats.on_schedule([s.metrics for s in scheduled + ignored], time.perf_counter() - start)
        outputs += self._finish_ignored(ignored)
        proposed = scheduler_output.scheduled_spec_tokens
        scheduler_output.grammar_bitmasks, failed = self.grammars.bitmasks(
            {s.request_id: s.grammar for s in scheduled if s.grammar is not None
             and s.request.num_computed_tokens + scheduler_output.num_scheduled_tokens[s.request_id]
             == s.request.num_tokens + len(proposed.get(s.request_id, ()))}, proposed)
        return scheduler_output, scheduled, failed

    def _update(self, scheduler_output: SchedulerOutput, scheduled: list[RequestState], result: ModelRunnerOutput,
                execute_time: float, failed: dict[str, str]) -> list[RequestOutput]:
        """Take a step's sampled tokens: advance the requests, advance their grammars, make their outputs,
        finish the ones that stopped. A request that failed on its own finishes with an error, the others go
        on: one whose grammar failed before the step takes no token, one that failed in the workers takes
        the tokens it sampled before failing (a verifying or multi-step step's), unless they stop it."""
        if result.pooler_outputs is not None:
            return self._update_pooled(scheduler_output, scheduled, result, execute_time)
        failed_before = failed
        failed = {**failed, **result.failed}
        if failed:
            result = dataclasses.replace(
                result,
                sampled_token_ids={rid: t for rid, t in result.sampled_token_ids.items() if rid not in failed_before},
                draft_token_ids={rid: t for rid, t in result.draft_token_ids.items() if rid not in failed})
        sampled = result.sampled_token_ids
        drafts, grammar_failed = self._advance_grammars(scheduled, result)
        failed.update(grammar_failed)
        self.schedulers[scheduler_output.virtual_engine].update_from_output(scheduler_output, sampled, drafts)
        tracked = [(s.request, s.metrics) for s in scheduled]
        if scheduler_output.scheduled_spec_tokens:
            self.stats.on_spec_tokens(tracked, scheduler_output.scheduled_spec_tokens, sampled)
        each_token = bool(scheduler_output.decode_steps) and self.config.scheduler_config.multi_step_stream_outputs
        tokens_time = time.time()
        step = self.output_processor.process(scheduled, result, failed, each_token)
        # Counted after the stop checks, so that tokens sampled past a stop are not generated tokens.
        self.stats.on_tokens(tracked, step.num_new_tokens, execute_time, result.model_forward_time, tokens_time,
                             per_token=bool(scheduler_output.decode_steps))
        for status in set(step.finished.values()):
            self._finish_requests([rid for rid, s in step.finished.items() if s == status], status)
        return self.streamed_tokens.first(step.outputs_by_token)

    @staticmethod
    def _advance_grammars(scheduled: list[RequestState], result: ModelRunnerOutput
                          ) -> tuple[dict[str, list[int]], dict[str, str]]:
        """Advance guided requests' matchers by their sampled tokens and cut their proposals before the first
        token the grammar refuses: the proposals to verify next, and the requests whose grammar failed
        (id -> why)."""
        drafts, failed = dict(result.draft_token_ids), {}
        for state in scheduled:
            if state.grammar is None:
                continue
            try:
                for token_id in result.sampled_token_ids.get(state.request_id, ()):
                    accept_token(state.request_id, state.grammar, token_id)
                proposed = drafts.get(state.request_id)
                if proposed:
                    drafts[state.request_id] = proposed[:num_grammar_tokens(state.grammar, proposed)]
            except Exception as error:
                failed[state.request_id] = f"its guided decoding grammar failed: {type(error).__name__}: {error}"
        return drafts, failed

    def _update_pooled(self, scheduler_output: SchedulerOutput, scheduled: list[RequestState],
                       result: ModelRunnerOutput, execute_time: float) -> list[PoolingRequestOutput]:
        """Pooling requests finish in the step that ran them, each with its one output."""
        self.schedulers[scheduler_output.virtual_engine].update_from_output(scheduler_output, {})
        done = [state for state in scheduled if state.request_id in result.pooler_outputs]
        self.stats.on_pooled([(s.request, s.metrics) for s in done], execute_time, result.model_forward_time)
        outputs = [pooling_output(state, result.pooler_outputs[state.request_id]) for state in done]
        self._finish_requests([state.request_id for state in done], RequestStatus.FINISHED_STOPPED)
        return outputs

    def _finish_ignored(self, states: list[RequestState]) -> list[RequestOutput]:
        outputs = [output for state in states
                   for output in self.output_processor.final_output(state, RequestStatus.FINISHED_IGNORED)]
        self._finish_requests([state.request_id for state in states], RequestStatus.FINISHED_IGNORED)
        return outputs

    # --- stats, tracing, profiling ------------------------------------------------------------------------

    def do_log_stats(self, scheduler_outputs: Any = None, model_output: Any = None, finished_before: Any = None,
                     skip: Any = None) -> None:
        """Hand the stats gathered since the last call to every stat logger (the engine calls it each step);
        the arguments exist for vLLM compatibility and are unused."""
        if not self.log_stats:
            return
        stats = self.stats.make_stats()
        for stat_logger in self.stat_loggers.values():
            stat_logger.log(stats)

    def add_logger(self, logger_name: str, logger: StatLoggerBase) -> None:
        if not self.log_stats:
            raise RuntimeError("Stat logging is disabled. Set `disable_log_stats=False` argument to enable.")
        if logger_name in self.stat_loggers:
            raise KeyError(f"Logger with name {logger_name} already exists.")
        self.stat_loggers[logger_name] = logger

    def remove_logger(self, logger_name: str) -> None:
        if not self.log_stats:
            raise RuntimeError("Stat logging is disabled. Set `disable_log_stats=False` argument to enable.")
        if logger_name not in self.stat_loggers:
            raise KeyError(f"Logger with name {logger_name} does not exist.")
        self.stat_loggers.pop(logger_name).close()

    def is_tracing_enabled(self) -> bool:
        return self.tracer is not None

    def start_profile(self) -> None:
        """Start the torch profiler on every worker (needs VLLM_TORCH_PROFILER_DIR or its pagedllm twin)."""
        self.model_executor.start_profile()

    def stop_profile(self) -> None:
        """Stop the profiler; each worker writes its trace into the profiler folder."""
        self.model_executor.stop_profile()

    # --- accessors ----------------------------------------------------------------------------------------

    def get_model_config(self) -> Any:
        return self.config.model_config

    def get_cache_config(self) -> Any:
        return self.config.cache_config

    def get_scheduler_config(self) -> Any:
        return self.config.scheduler_config

    def get_parallel_config(self) -> Any:
        return self.config.parallel_config

    def get_engine_config(self) -> EngineConfig:
        return self.config

    def collective_rpc(self, method: Any, timeout: Optional[float] = None, args: tuple = (),
                       kwargs: Optional[dict[str, Any]] = None) -> list[Any]:
        return self.model_executor.collective_rpc(method, timeout, args, kwargs)

    def check_health(self) -> None:
        self.model_executor.check_health()
