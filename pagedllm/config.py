"""EngineArgs (the user-facing flags) and the frozen configs the engine is built from."""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import types
import typing
from dataclasses import dataclass
from typing import Any, Optional, Union

from pagedllm.config_compat import CompatArgs, check_unsupported
from pagedllm.pooling.config import (POOLING_TASKS, PoolerConfig, check_task_name, default_pooler_config,
                                     is_encoder, resolve_task, sentence_transformers_max_length)
from pagedllm.spec_decode.config import SpeculativeConfig, check_draft_vocabulary, parse_speculative_config

logger = logging.getLogger(__name__)

_GiB = 1 << 30
ALLOWED_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
# On CPU the KV cache is host memory: by default a quarter of the machine's memory, at most this much.
_DEFAULT_CPU_KV_CACHE_GIB = 4


@dataclass(frozen=True)
class ModelConfig:
    model: str  # what the user asked for
    path: str  # the resolved local file or folder
    format: str  # "gguf" or "hf"
    hf_config: Any
    dtype: Any  # torch.dtype
    activation_dtype: Any  # torch.dtype of activations and the KV cache (_activation_dtype)
    max_model_len: int
    served_model_name: str
    seed: int
    max_logprobs: int
    skip_tokenizer_init: bool
    tokenizer: str
    generation_config: str
    quantization: Optional[str]
    enable_prompt_embeds: bool
    task: str  # resolved: "generate" or one of the pooling tasks
    enforce_eager: bool  # no decode graphs (worker/cpu_graph.py on CPU, worker/cuda_graph.py on CUDA)
    pooler_config: Any = None  # a pooling model's PoolerConfig (pagedllm/pooling/config.py); None to generate
    enable_sleep_mode: bool = False  # sleep() / wake_up() may release and restore weights and KV cache
    cuda_graph_sizes: tuple[int, ...] = (512,)  # as vLLM reads them (worker/graph_dispatch.py)

    @property
    def runner_type(self) -> str:
        """"pooling" for embedding, classification, score and reward models, else "generate"."""
        return "generate" if self.pooler_config is None else "pooling"

    @property
    def vocab_size(self) -> int:
        return self.hf_config.vocab_size

    def get_vocab_size(self) -> int:
        return self.vocab_size


@dataclass(frozen=True)
class CacheConfig:
    block_size: int
    num_gpu_blocks_override: Optional[int]
    kv_cache_memory: Optional[int]  # bytes, CPU only; None picks the default
    gpu_memory_utilization: float
    swap_space: float  # GiB of host memory per worker for swapped-out blocks
    enable_prefix_caching: bool
    cache_dtype: str = "auto"

    @property
    def swap_space_bytes(self) -> int:
        return int(self.swap_space * _GiB)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool
    preemption_mode: Optional[str]
    policy: str
    num_scheduler_steps: int  # decode steps per scheduling decision (multi-step; see core/scheduler.py)
    watermark: float = 0.01
    # Speculative decoding (pagedllm/spec_decode): proposed tokens verified per step, KV slots reserved past
    # them for a draft model, and the running batch from which speculation is off.
    num_speculative_tokens: int = 0
    num_lookahead_slots: int = 0
    speculative_disable_by_batch_size: Optional[int] = None
    max_loras: int = 0  # distinct LoRA adapters one step may use (0: LoRA is off)
    # Multi-step: each of a group's tokens is output as it is taken (True) or all at the group's end (False).
    multi_step_stream_outputs: bool = True

    @property
    def is_multi_step(self) -> bool:
        return self.num_scheduler_steps > 1


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int
    pipeline_parallel_size: int
    distributed_executor_backend: Any  # "uni", "mp", "ray" or an executor class

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass(frozen=True)
class DeviceConfig:
    device: str  # "cpu" or "cuda"


@dataclass(frozen=True)
class ObservabilityConfig:
    otlp_traces_endpoint: Optional[str]
    collect_detailed_traces: Optional[str]
    disable_log_stats: bool


@dataclass(frozen=True)
class LoRAConfig:
    max_loras: int  # adapters one step may use (slots in the model's layers)
    max_lora_rank: int
    max_cpu_loras: int  # adapters the workers keep read in host memory
    lora_dtype: Any  # torch dtype of the adapters' weights


# vLLM's allowed values of max_lora_rank.
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine, scheduler and workers are built from."""

    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parallel_config: ParallelConfig
    device_config: DeviceConfig
    observability_config: ObservabilityConfig
    lora_config: Optional[LoRAConfig] = None
    speculative_config: Optional[SpeculativeConfig] = None

    def for_worker_processes(self) -> EngineConfig:
        """This config as worker processes receive it: the model's transformers config as plain attributes.
        Unpickling a transformers config class imports transformers, about 4 s of CPU in each process, and the
        workers read only its values (and `num_labels`, a property)."""
        hf_config = self.model_config.hf_config
        values = dict(vars(hf_config), num_labels=hf_config.num_labels)
        model_config = dataclasses.replace(self.model_config, hf_config=types.SimpleNamespace(**values))
        return dataclasses.replace(self, model_config=model_config)


_HELP = {
    "model": "Model name (alias), GGUF file or Hugging Face folder; defaults to the embedded SmolLM2-135M-Instruct.",
    "max_model_len": "Longest prompt plus output, in tokens; defaults to the model's context length.",
    "block_size": "Tokens per KV cache block.",
    "kv_cache_memory": "Bytes of host memory for the KV cache on CPU (default: a quarter of RAM, at most 4 GiB).",
    "num_gpu_blocks_override": "Exact number of KV cache blocks (for tests).",
    "max_num_batched_tokens": "Token budget of one engine step.",
    "max_num_seqs": "Most requests in one engine step.",
    "distributed_executor_backend": "How the model runs: 'uni' (in process), 'mp' or 'ray'.",
    "enable_prefix_caching": "Reuse the KV cache of shared prompt prefixes (default: on).",
    "enable_chunked_prefill": "Split long prefills into chunks within the token budget.",
    "speculative_config": "Speculative decoding as JSON, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'.",
    "num_scheduler_steps": "Decode steps per scheduling decision (multi-step): the worker feeds each sampled token "
                           "back for the next step.",
    "multi_step_stream_outputs": "With multi-step, output each token as it is taken (default), or each group's "
                                 "tokens at its end.",
    "enforce_eager": "Run every step through the model's Python code: no CPU graphs for decode batches, no "
                     "CUDA graphs on a GPU.",
}


@dataclass
class EngineArgs(CompatArgs):
    """The engine's arguments, with vLLM's names and defaults; `LLM(**kwargs)` and the CLI accept the same.

    The fields here are the ones pagedllm implements; the rest of vLLM's come from `CompatArgs`."""

    model: Optional[str] = None
    tokenizer: Optional[str] = None
    skip_tokenizer_init: bool = False
    tokenizer_mode: str = "auto"
    trust_remote_code: bool = False
    revision: Optional[str] = None
    dtype: str = "auto"
    seed: Optional[int] = None  # None seeds the engine with 0, as vLLM V1 does
    max_model_len: Optional[int] = None
    served_model_name: Optional[str] = None
    generation_config: str = "auto"
    task: str = "auto"
    quantization: Optional[str] = None
    enable_prompt_embeds: bool = False
    max_logprobs: int = 20
    device: str = "auto"
    block_size: Optional[int] = None  # None: 16
    kv_cache_memory: Optional[int] = None
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: Optional[int] = None
    swap_space: float = 4
    # None means on: the bookkeeping costs well under 1 ms a step and shared prefixes (system prompts,
    # few-shot examples, repeated requests) skip their prefill.
    enable_prefix_caching: Optional[bool] = None
    max_num_batched_tokens: Optional[int] = None
    max_num_seqs: Optional[int] = None  # None: 256
    enable_chunked_prefill: Optional[bool] = None
    preemption_mode: Optional[str] = None
    scheduling_policy: str = "fcfs"
    num_scheduler_steps: int = 1
    multi_step_stream_outputs: bool = True
    disable_async_output_proc: bool = False
    enforce_eager: bool = False
    distributed_executor_backend: Any = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    disable_log_stats: bool = False
    otlp_traces_endpoint: Optional[str] = None
    collect_detailed_traces: Optional[str] = None
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: Optional[int] = None
    lora_dtype: Optional[str] = "auto"
    speculative_config: Optional[dict] = None
    enable_sleep_mode: bool = False
    override_pooler_config: Any = None  # a dict or PoolerConfig: pooling_type, normalize, softmax, step_tag_id

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add one `--field-name` flag per field, typed from the field's annotation."""
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            flag = "--" + f.name.replace("_", "-")
            kind = _cli_type(hints[f.name])
            if kind is bool:
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default,
                                    help=_HELP.get(f.name))
            else:
                default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
                parser.add_argument(flag, type=kind, default=default, help=_HELP.get(f.name))
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)})

    def create_engine_config(self) -> EngineConfig:
        """Resolve the model and derive every default; impossible settings raise ValueError."""
        import torch

        from pagedllm.model.source import resolve_model_source

        check_unsupported(self)
        check_task_name(self.task)
        source = resolve_model_source(self.model, self.task)
        task = resolve_task(self.task, source.hf_config)
        pooler_config = None
        if task in POOLING_TASKS:
            pooler_config = PoolerConfig.from_override(self.override_pooler_config).over(
                default_pooler_config(task, source.hf_config, source.path if source.format == "hf" else None))
            self._check_pooling_flags()
        elif self.override_pooler_config:
            raise ValueError(f"override_pooler_config is only read by pooling tasks, not task={task!r}.")
        _check_load_format(self.load_format, source.format)
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}.")
        dtype = _resolve_dtype(self.dtype, device)
        max_model_len = _resolve_max_model_len(self.max_model_len, source.hf_config, source)
        if self.generation_config not in ("auto", "vllm") and not os.path.isdir(self.generation_config):
            raise ValueError(f"generation_config must be 'auto', 'vllm' or a folder, got {self.generation_config!r}.")
        _check_quantization(self.quantization, source.format, device, dtype)
        model_config = ModelConfig(
            model=self.model or source.name, path=source.path, format=source.format,
            hf_config=source.hf_config, dtype=dtype, activation_dtype=_activation_dtype(dtype, device, source.hf_config),
            max_model_len=max_model_len,
            served_model_name=self.served_model_name or (self.model or source.name),
            seed=self.seed if self.seed is not None else 0,
            max_logprobs=self.max_logprobs, skip_tokenizer_init=self.skip_tokenizer_init,
            tokenizer=self.tokenizer or source.path, generation_config=self.generation_config,
            quantization=self.quantization, enable_prompt_embeds=self.enable_prompt_embeds,
            task=task, enforce_eager=self.enforce_eager, pooler_config=pooler_config,
            enable_sleep_mode=self.enable_sleep_mode, cuda_graph_sizes=self._cuda_graph_sizes())
        block_size = self.block_size if self.block_size is not None else 16
        if block_size not in ALLOWED_BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {ALLOWED_BLOCK_SIZES}, got {self.block_size}.")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}.")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise ValueError(f"num_gpu_blocks_override must be at least 1, got {self.num_gpu_blocks_override}.")
        if self.swap_space < 0:
            raise ValueError(f"swap_space must be non-negative, got {self.swap_space}.")
        if self.preemption_mode == "swap" and self.pipeline_parallel_size > 1:
            raise ValueError("preemption_mode='swap' is not supported with pipeline_parallel_size > 1; use "
                             "preemption_mode='recompute'.")
        if self.preemption_mode == "swap" and self.swap_space == 0:
            raise ValueError("preemption_mode='swap' needs swap_space > 0 (GiB of host memory for swapped-out "
                             "blocks).")
        speculative = parse_speculative_config(self.speculative_config)
        self._check_multi_step(speculative)
        if speculative is not None:
            check_draft_vocabulary(speculative, source.hf_config)
            if self.enable_prompt_embeds:
                raise ValueError("speculative_config does not work with enable_prompt_embeds: proposals need "
                                 "the prompt's token ids.")
        cache_config = CacheConfig(
            block_size=block_size, num_gpu_blocks_override=self.num_gpu_blocks_override,
            kv_cache_memory=self.kv_cache_memory if self.kv_cache_memory is not None else _default_kv_cache_memory(),
            gpu_memory_utilization=self.gpu_memory_utilization, swap_space=self.swap_space,
            # A pooling request needs the hidden state of every prompt token: no prefix may be skipped.
            enable_prefix_caching=self.enable_prefix_caching is not False and pooler_config is None)
        return EngineConfig(
            model_config=model_config, cache_config=cache_config,
            scheduler_config=self._scheduler_config(max_model_len, speculative),
            parallel_config=self._parallel_config(source.hf_config), device_config=DeviceConfig(device),
            observability_config=ObservabilityConfig(self.otlp_traces_endpoint, self.collect_detailed_traces,
                                                     self.disable_log_stats),
            lora_config=self._lora_config(dtype) if self.enable_lora else None,
            speculative_config=speculative)

    def _cuda_graph_sizes(self) -> tuple[int, ...]:
        sizes = self.cuda_graph_sizes
        if not sizes or any(isinstance(size, bool) or not isinstance(size, int) or size < 1 for size in sizes):
            raise ValueError(f"cuda_graph_sizes must be a list of positive batch sizes, got {sizes!r}.")
        return tuple(sizes)

    def _lora_config(self, model_dtype: Any) -> LoRAConfig:
        if self.max_lora_rank not in LORA_RANKS:
            raise ValueError(f"max_lora_rank ({self.max_lora_rank}) must be one of {LORA_RANKS}.")
        if self.max_loras < 1:
            raise ValueError(f"max_loras ({self.max_loras}) must be >= 1.")
        max_cpu_loras = self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras
        if max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({max_cpu_loras}) must be >= max_loras ({self.max_loras})")
        if self.lora_dtype in (None, "auto"):
            lora_dtype = model_dtype
        elif self.lora_dtype in ("float32", "float16", "bfloat16"):
            lora_dtype = _resolve_dtype(self.lora_dtype, "cpu")
        else:
            raise ValueError(f"lora_dtype must be 'auto', 'float32', 'float16' or 'bfloat16', got {self.lora_dtype!r}.")
        return LoRAConfig(self.max_loras, self.max_lora_rank, max_cpu_loras, lora_dtype)

    def _check_pooling_flags(self) -> None:
        """A pooling request runs its whole prompt in one pass: no chunks, no cached prefix."""
        if self.enable_chunked_prefill:
            raise ValueError("enable_chunked_prefill=True is not supported for pooling tasks: chunking is not "
                             "allowed for an encoder, which runs the whole prompt at once.")
        if self.preemption_mode == "swap":
            raise ValueError("preemption_mode='swap' is not supported for pooling tasks: a pooling request "
                             "finishes in the step it runs, so it is never preempted.")
        if self.enable_prefix_caching:
            raise ValueError("enable_prefix_caching=True is not supported for pooling tasks: every prompt token's "
                             "hidden state is pooled, so none can come from the cache.")
        if self.speculative_config:
            raise ValueError("speculative_config is not supported for pooling tasks: they generate no tokens.")
        if self.enable_lora:
            raise ValueError("enable_lora=True is not supported for pooling tasks: adapters apply to generation.")

    def _check_multi_step(self, speculative: Optional[SpeculativeConfig]) -> None:
        """vLLM's refusals for num_scheduler_steps > 1, and pagedllm's own: the worker feeds sampled tokens back
        to its own next forward pass, which a model split over processes cannot do without more traffic."""
        if self.num_scheduler_steps < 1:
            raise ValueError(f"num_scheduler_steps ({self.num_scheduler_steps}) must be greater than or equal to 1.")
        if self.num_scheduler_steps == 1:
            return
        if speculative is not None:
            raise ValueError("Speculative decoding is not supported with multi-step (--num-scheduler-steps > 1): "
                             "unset speculative_config or num_scheduler_steps.")
        if self.tensor_parallel_size * self.pipeline_parallel_size > 1:
            raise ValueError("num_scheduler_steps > 1 is not supported by pagedllm with tensor_parallel_size or "
                             "pipeline_parallel_size above 1.")

    def _scheduler_config(self, max_model_len: int, speculative: Optional[SpeculativeConfig] = None
                          ) -> SchedulerConfig:
        chunked = bool(self.enable_chunked_prefill)
        max_num_seqs = self.max_num_seqs if self.max_num_seqs is not None else 256
        budget = self.max_num_batched_tokens
        if budget is None:
            budget = 2048 if chunked else max(max_model_len, 2048)
        if not chunked and budget < max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({budget}) is smaller than max_model_len ({max_model_len}): such a "
                "prompt could never be scheduled. Raise max_num_batched_tokens, lower max_model_len, "
                "or enable chunked prefill.")
        if budget < 1 or max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be at least 1.")
        if budget < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({budget}) must be at least max_num_seqs "
                             f"({max_num_seqs}).")
        if self.preemption_mode not in (None, "recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}.")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', got {self.scheduling_policy!r}.")
        return SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=max_model_len,
            enable_chunked_prefill=chunked, preemption_mode=self.preemption_mode, policy=self.scheduling_policy,
            num_scheduler_steps=self.num_scheduler_steps, multi_step_stream_outputs=self.multi_step_stream_outputs,
            max_loras=self.max_loras if self.enable_lora else 0,
            num_speculative_tokens=speculative.num_speculative_tokens if speculative else 0,
            num_lookahead_slots=speculative.num_lookahead_slots if speculative else 0,
            speculative_disable_by_batch_size=speculative.disable_by_batch_size if speculative else None)

    def _parallel_config(self, hf_config: Any) -> ParallelConfig:
        from pagedllm.distributed.partition import verify_parallel_sizes
        from pagedllm.executor.base import ExecutorBase

        backend = self.distributed_executor_backend
        if backend is None:
            backend = "uni" if self.tensor_parallel_size * self.pipeline_parallel_size == 1 else "mp"
        known = ("uni", "mp", "ray")
        if not (backend in known or (isinstance(backend, type) and issubclass(backend, ExecutorBase))):
            raise ValueError(f"Unrecognized distributed executor backend {backend!r}. Supported values are "
                             "'uni', 'mp', 'ray' or a subclass of ExecutorBase.")
        verify_parallel_sizes(hf_config, self.tensor_parallel_size, self.pipeline_parallel_size)
        world_size = self.tensor_parallel_size * self.pipeline_parallel_size
        if is_encoder(hf_config) and world_size > 1:
            raise ValueError("An encoder model (BERT) runs on one worker: tensor_parallel_size and "
                             "pipeline_parallel_size must be 1.")
        if backend == "uni" and world_size > 1:
            raise ValueError(f"distributed_executor_backend='uni' runs one worker, but tensor_parallel_size * "
                             f"pipeline_parallel_size is {world_size}; use 'mp' or 'ray'.")
        return ParallelConfig(self.tensor_parallel_size, self.pipeline_parallel_size, backend)


def _cli_type(annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if typing.get_origin(annotation) is Union and len(args) == 1 else annotation
    if base in (bool, int, float, str):
        return base
    return _json_or_text


def _json_or_text(text: str) -> Any:
    """A flag for a dict, list or mixed-type field takes JSON (`--hf-overrides '{"a": 1}'`) or plain text."""
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _check_quantization(quantization: Optional[str], model_format: str, device: str, dtype: Any) -> None:
    """None, 'int8' (weight-only, made at load), or vLLM's 'gguf': a GGUF file's Q4_1 and Q8_0 weights run as
    their blocks, which pagedllm does on CPU in float32 and bfloat16 (where it also does so unasked; the loader
    refuses a model whose linear weights it cannot all stream so)."""
    import torch

    if quantization not in (None, "int8", "gguf"):
        raise ValueError(f"quantization {quantization!r} is not supported; use None, 'int8' or 'gguf'.")
    if quantization != "gguf":
        return
    if model_format != "gguf":
        raise ValueError("quantization='gguf' needs a GGUF model file; this model is a Hugging Face folder.")
    if device != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"quantization='gguf' runs a GGUF file's blocks on CPU in float32 or bfloat16, not on "
                         f"device={device!r} with dtype={str(dtype).replace('torch.', '')!r}; leave quantization "
                         "unset to run the weights dequantized.")


def _check_load_format(load_format: str, model_format: str) -> None:
    expected = "gguf" if model_format == "gguf" else "safetensors"
    if load_format not in ("auto", expected):
        raise ValueError(f"load_format={load_format!r} is not supported by pagedllm for this model: use 'auto' "
                         f"or {expected!r}.")


def _resolve_dtype(dtype: str, device: str) -> Any:
    import torch

    if dtype == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    names = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16, "half": torch.float16,
             "bfloat16": torch.bfloat16}
    if dtype not in names:
        raise ValueError(f"dtype must be one of 'auto', {', '.join(repr(n) for n in names)}; got {dtype!r}.")
    return names[dtype]


def _activation_dtype(dtype: Any, device: str, hf_config: Any) -> Any:
    """float32 for a decoder in bfloat16 on CPU, else `dtype`. There its linear weights are stored in bfloat16,
    which halves the bytes each decoded token streams, and the C kernels widen them to float32 as they load
    (exact, and fast on any x86 CPU, with or without bfloat16 instructions), so activations, sums and the KV
    cache stay float32, and greedy output stays closer to float32's than bfloat16 arithmetic would. An
    encoder, which keeps no KV cache, runs PyTorch's bfloat16 operators."""
    import torch

    if device == "cpu" and dtype == torch.bfloat16 and not is_encoder(hf_config):
        return torch.float32
    return dtype


def _resolve_max_model_len(requested: Optional[int], hf_config: Any, source: Any) -> int:
    """The model's context length, or a sentence-transformers folder's max_seq_length where it has one."""
    limit = getattr(hf_config, "max_position_embeddings", None) or 2048
    if source.format == "hf":
        limit = min(limit, sentence_transformers_max_length(source.path) or limit)
    if requested is None:
        return limit
    if requested < 1 or requested > limit:
        raise ValueError(f"max_model_len ({requested}) must be between 1 and the model's context length ({limit}).")
    return requested


def _default_kv_cache_memory() -> int:
    """VLLM_CPU_KVCACHE_SPACE (GiB) if set, else a quarter of physical memory capped at 4 GiB."""
    env = os.environ.get("PAGEDLLM_CPU_KVCACHE_SPACE") or os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    if env:
        return int(float(env) * _GiB)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(_DEFAULT_CPU_KV_CACHE_GIB * _GiB, total // 4)


@dataclass
class AsyncEngineArgs(EngineArgs):
    """EngineArgs for `AsyncLLMEngine`, plus whether to log each request's arrival and abort."""

    disable_log_requests: bool = False
