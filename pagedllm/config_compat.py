"""vLLM 0.9.2's EngineArgs fields that pagedllm does not act on, so a vLLM user's arguments are never dropped.

Each such field is either inert (no meaning here: accepted with any value, the reason in `INERT`, and the table in
docs/engine_args.md) or unsupported (accepted at vLLM's default; any other value raises a ValueError naming it).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Union


@dataclass(kw_only=True)
class CompatArgs:
    """vLLM's fields beyond those pagedllm implements, with vLLM's defaults; keyword-only, so that
    `EngineArgs(model)` still takes the model first."""

    hf_config_path: Optional[str] = None
    allowed_local_media_path: str = ""
    download_dir: Optional[str] = None
    load_format: str = "auto"
    config_format: str = "auto"
    kv_cache_dtype: str = "auto"
    cuda_graph_sizes: list[int] = field(default_factory=lambda: [512])
    data_parallel_size: int = 1
    data_parallel_rank: Optional[int] = None
    data_parallel_size_local: Optional[int] = None
    data_parallel_address: Optional[str] = None
    data_parallel_rpc_port: Optional[int] = None
    data_parallel_backend: str = "mp"
    enable_expert_parallel: bool = False
    enable_eplb: bool = False
    num_redundant_experts: int = 0
    eplb_window_size: int = 1000
    eplb_step_interval: int = 3000
    eplb_log_balancedness: bool = False
    max_parallel_loading_workers: Optional[int] = None
    prefix_caching_hash_algo: str = "builtin"
    disable_sliding_window: bool = False
    disable_cascade_attn: bool = False
    use_v2_block_manager: bool = True
    cpu_offload_gb: float = 0
    max_num_partial_prefills: int = 1
    max_long_partial_prefills: int = 1
    long_prefill_token_threshold: int = 0
    code_revision: Optional[str] = None
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    rope_theta: Optional[float] = None
    hf_token: Optional[Union[bool, str]] = None
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    tokenizer_revision: Optional[str] = None
    max_seq_len_to_capture: int = 8192
    disable_custom_all_reduce: bool = False
    tokenizer_pool_size: int = 0
    tokenizer_pool_type: str = "ray"
    tokenizer_pool_extra_config: dict[str, Any] = field(default_factory=dict)
    limit_mm_per_prompt: dict[str, int] = field(default_factory=dict)
    media_io_kwargs: dict[str, Any] = field(default_factory=dict)
    mm_processor_kwargs: Optional[dict[str, Any]] = None
    disable_mm_preprocessor_cache: bool = False
    enable_lora_bias: bool = False
    fully_sharded_loras: bool = False
    lora_extra_vocab_size: int = 256
    long_lora_scaling_factors: Optional[tuple[float, ...]] = None
    enable_prompt_adapter: bool = False
    max_prompt_adapters: int = 1
    max_prompt_adapter_token: int = 0
    ray_workers_use_nsight: bool = False
    num_lookahead_slots: int = 0
    model_loader_extra_config: dict[str, Any] = field(default_factory=dict)
    ignore_patterns: Optional[Union[str, list[str]]] = None
    scheduler_delay_factor: float = 0.0
    disable_chunked_mm_input: bool = False
    disable_hybrid_kv_cache_manager: bool = False
    guided_decoding_backend: str = "auto"
    guided_decoding_disable_fallback: bool = False
    guided_decoding_disable_any_whitespace: bool = False
    guided_decoding_disable_additional_properties: bool = False
    logits_processor_pattern: Optional[str] = None
    qlora_adapter_name_or_path: Optional[str] = None
    show_hidden_metrics_for_version: Optional[str] = None
    scheduler_cls: str = "vllm.core.scheduler.Scheduler"
    override_neuron_config: dict[str, Any] = field(default_factory=dict)
    # vLLM's default is an empty CompilationConfig; an empty dict is the same request: nothing set.
    compilation_config: Any = field(default_factory=dict)
    worker_cls: str = "auto"
    worker_extension_cls: str = ""
    kv_transfer_config: Optional[dict[str, Any]] = None
    kv_events_config: Optional[dict[str, Any]] = None
    override_generation_config: dict[str, Any] = field(default_factory=dict)
    model_impl: str = "auto"
    override_attention_dtype: Optional[str] = None
    calculate_kv_scales: bool = False
    additional_config: dict[str, Any] = field(default_factory=dict)
    enable_reasoning: Optional[bool] = None
    reasoning_parser: str = ""
    use_tqdm_on_load: bool = True
    pt_load_map_location: str = "cpu"
    enable_multimodal_encoder_data_parallel: bool = False


# Fields with no meaning in pagedllm: any value is accepted and changes nothing, for the reason given.
INERT: dict[str, str] = {
    "allowed_local_media_path": "no multimodal inputs: there is no media to read",
    "download_dir": "nothing is downloaded: models are local files",
    "hf_token": "no model hub is contacted",
    "max_seq_len_to_capture": ("CUDA graph capture limit; pagedllm's CUDA graphs take any length up to "
                               "max_model_len"),
    "compilation_config": "pagedllm does not use torch.compile; its CPU and CUDA graphs follow `enforce_eager`",
    "enable_expert_parallel": "expert parallelism applies to mixture-of-experts models; pagedllm runs none",
    "enable_eplb": "expert load balancing applies to mixture-of-experts models; pagedllm runs none",
    "num_redundant_experts": "mixture-of-experts only",
    "eplb_window_size": "mixture-of-experts only",
    "eplb_step_interval": "mixture-of-experts only",
    "eplb_log_balancedness": "mixture-of-experts only",
    "max_parallel_loading_workers": "weights load in one pass in the worker; there are no loading workers",
    "prefix_caching_hash_algo": ("prefix-cache hits compare the stored tokens, so the hash choice "
                                 "cannot change a result"),
    "disable_sliding_window": "pagedllm always attends over the whole context: no sliding window to disable",
    "disable_cascade_attn": "cascade attention is a CUDA kernel choice of vLLM V1",
    "use_v2_block_manager": "deprecated in vLLM; pagedllm has one block manager",
    "disable_custom_all_reduce": "CUDA all-reduce kernels; pagedllm has none",
    "tokenizer_pool_size": "deprecated in vLLM, where it has no effect either",
    "tokenizer_pool_type": "deprecated in vLLM, where it has no effect either",
    "tokenizer_pool_extra_config": "deprecated in vLLM, where it has no effect either",
    "limit_mm_per_prompt": "text-only models: a prompt with multi_modal_data is refused",
    "media_io_kwargs": "text-only models: no media is decoded",
    "mm_processor_kwargs": "text-only models: no multimodal processor",
    "disable_mm_preprocessor_cache": "text-only models: no multimodal preprocessor",
    "disable_chunked_mm_input": "text-only models: no multimodal inputs to chunk",
    "enable_multimodal_encoder_data_parallel": "text-only models: no multimodal encoder",
    "ray_workers_use_nsight": "Nsight profiling of CUDA Ray workers",
    "disable_hybrid_kv_cache_manager": "every supported model has one attention type: one KV cache layout",
    "guided_decoding_disable_fallback": "xgrammar is the only backend: there is nothing to fall back to",
    "guided_decoding_disable_additional_properties": "read only by the guidance backend",
    "show_hidden_metrics_for_version": "no metric is hidden: every Prometheus metric is always exported",
    "disable_async_output_proc": "outputs are processed in the step itself; there is no async output processing",
    "override_neuron_config": "AWS Neuron devices only",
    "calculate_kv_scales": "scales of an fp8 KV cache; the KV cache is never fp8 here",
    "additional_config": "platform plugins' settings; pagedllm has no platform plugins",
    "enable_reasoning": "deprecated in vLLM; reasoning output is not parsed",
    "use_tqdm_on_load": "loading shows no progress bar (it takes about a second)",
    "pt_load_map_location": "PyTorch .pt/.bin weights are not loaded; GGUF and safetensors load on the model's device",
    "trust_remote_code": "the model code is pagedllm's own; no code from model folders is ever run",
}

# Fields pagedllm does not implement: vLLM's default (or a value listed in SUPPORTED_VALUES) works, anything else
# raises a ValueError with this reason.
UNSUPPORTED: dict[str, str] = {
    "hf_config_path": "the config is read from the model itself",
    "load_format": "weights load from the model's own files ('auto', or 'gguf' / 'safetensors' as the model is)",
    "config_format": "the config is read in Hugging Face format",
    "kv_cache_dtype": "the KV cache uses the model dtype",
    "data_parallel_size": "data parallelism is not implemented",
    "data_parallel_rank": "data parallelism is not implemented",
    "data_parallel_size_local": "data parallelism is not implemented",
    "data_parallel_address": "data parallelism is not implemented",
    "data_parallel_rpc_port": "data parallelism is not implemented",
    "data_parallel_backend": "data parallelism is not implemented",
    "cpu_offload_gb": "weights are not offloaded",
    "max_num_partial_prefills": "one partial prefill at a time",
    "max_long_partial_prefills": "one partial prefill at a time",
    "long_prefill_token_threshold": "one partial prefill at a time",
    "revision": "models are local files: there is no revision to choose",
    "code_revision": "models are local files: there is no revision to choose",
    "tokenizer_revision": "models are local files: there is no revision to choose",
    "tokenizer_mode": "the tokenizer is the model's fast Hugging Face tokenizer ('auto')",
    "rope_scaling": "the model's config is used as it is",
    "rope_theta": "the model's config is used as it is",
    "hf_overrides": "the model's config is used as it is",
    "enable_lora_bias": "LoRA adapters update the q/k/v/o and gate/up/down projections without biases",
    "fully_sharded_loras": "LoRA weights split over tensor-parallel ranks as their base layers do",
    "lora_extra_vocab_size": "LoRA adapters do not extend the vocabulary",
    "long_lora_scaling_factors": "long-context LoRA is not implemented",
    "qlora_adapter_name_or_path": "QLoRA is not implemented",
    "enable_prompt_adapter": "prompt adapters are not implemented",
    "max_prompt_adapters": "prompt adapters are not implemented",
    "max_prompt_adapter_token": "prompt adapters are not implemented",
    "num_lookahead_slots": "lookahead slots follow from speculative_config",
    "model_loader_extra_config": "the model loader takes no options",
    "ignore_patterns": "every weight file of the model folder is loaded",
    "scheduler_delay_factor": "waiting requests are scheduled without delay",
    "guided_decoding_backend": "xgrammar is the guided decoding backend ('auto' or 'xgrammar')",
    "guided_decoding_disable_any_whitespace": "set it per request in GuidedDecodingParams instead",
    "logits_processor_pattern": "logits processors cannot be named by the server's requests",
    "collect_detailed_traces": "spans carry the request-level attributes only",
    "scheduler_cls": "the scheduler is pagedllm's own",
    "worker_cls": "the worker is pagedllm's own",
    "worker_extension_cls": "workers cannot be extended",
    "kv_transfer_config": "KV cache transfer between instances is not implemented",
    "kv_events_config": "KV cache events are not published",
    "override_generation_config": "defaults come from the model's generation config (see generation_config)",
    "model_impl": "the model implementation is pagedllm's own ('auto' or 'vllm')",
    "override_attention_dtype": "attention runs in the model dtype",
    "reasoning_parser": "reasoning output is not parsed",
}

# Values beyond vLLM's default that pagedllm implements for an otherwise unsupported field.
SUPPORTED_VALUES: dict[str, tuple] = {
    "config_format": ("hf",),
    "load_format": ("gguf", "safetensors"),  # checked against the model's format once it is found
    "guided_decoding_backend": ("xgrammar",),
    "model_impl": ("vllm",),
}

def check_unsupported(args: Any) -> None:
    """Raise a ValueError naming the first field of `args` set to a value pagedllm does not implement."""
    defaults = {f.name: _default(f) for f in dataclasses.fields(args)}
    for name, reason in UNSUPPORTED.items():
        value = getattr(args, name)
        if _is_default(value, defaults[name]) or value in SUPPORTED_VALUES.get(name, ()):
            continue
        raise ValueError(f"{name}={value!r} is not supported by pagedllm: {reason}.")


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _is_default(value: Any, default: Any) -> bool:
    # vLLM's LLM() passes None for its dict-valued arguments when they are not given.
    return value == default or (value is None and default in ({}, []))
