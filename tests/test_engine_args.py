"""Every field of vLLM 0.9.2's EngineArgs is accepted by EngineArgs, LLM and the CLI with vLLM's default; any
other value either works or raises a ValueError naming the field, unless the field is documented as inert."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from pagedllm import EngineArgs
from pagedllm.config_compat import INERT, UNSUPPORTED
from pagedllm.entrypoints.cli import build_parser

# vLLM 0.9.2's vllm/engine/arg_utils.py EngineArgs, in its order, with its defaults. Two differ on purpose: `model`
# (vLLM: "facebook/opt-125m"; here None is the embedded default model) and `compilation_config` (vLLM: an empty
# CompilationConfig; here an empty dict, the same request).
VLLM_FIELDS = {
    "model": None, "served_model_name": None, "tokenizer": None, "hf_config_path": None, "task": "auto",
    "skip_tokenizer_init": False, "enable_prompt_embeds": False, "tokenizer_mode": "auto",
    "trust_remote_code": False, "allowed_local_media_path": "", "download_dir": None, "load_format": "auto",
    "config_format": "auto", "dtype": "auto", "kv_cache_dtype": "auto", "seed": None, "max_model_len": None,
    "cuda_graph_sizes": [512], "distributed_executor_backend": None, "pipeline_parallel_size": 1,
    "tensor_parallel_size": 1, "data_parallel_size": 1, "data_parallel_rank": None, "data_parallel_size_local": None,
    "data_parallel_address": None, "data_parallel_rpc_port": None, "data_parallel_backend": "mp",
    "enable_expert_parallel": False, "enable_eplb": False, "num_redundant_experts": 0, "eplb_window_size": 1000,
    "eplb_step_interval": 3000, "eplb_log_balancedness": False, "max_parallel_loading_workers": None,
    "block_size": None, "enable_prefix_caching": None, "prefix_caching_hash_algo": "builtin",
    "disable_sliding_window": False, "disable_cascade_attn": False, "use_v2_block_manager": True, "swap_space": 4,
    "cpu_offload_gb": 0, "gpu_memory_utilization": 0.9, "max_num_batched_tokens": None,
    "max_num_partial_prefills": 1, "max_long_partial_prefills": 1, "long_prefill_token_threshold": 0,
    "max_num_seqs": None, "max_logprobs": 20, "disable_log_stats": False, "revision": None, "code_revision": None,
    "rope_scaling": {}, "rope_theta": None, "hf_token": None, "hf_overrides": {}, "tokenizer_revision": None,
    "quantization": None, "enforce_eager": False, "max_seq_len_to_capture": 8192, "disable_custom_all_reduce": False,
    "tokenizer_pool_size": 0, "tokenizer_pool_type": "ray", "tokenizer_pool_extra_config": {},
    "limit_mm_per_prompt": {}, "media_io_kwargs": {}, "mm_processor_kwargs": None,
    "disable_mm_preprocessor_cache": False, "enable_lora": False, "enable_lora_bias": False, "max_loras": 1,
    "max_lora_rank": 16, "fully_sharded_loras": False, "max_cpu_loras": None, "lora_dtype": "auto",
    "lora_extra_vocab_size": 256, "long_lora_scaling_factors": None, "enable_prompt_adapter": False,
    "max_prompt_adapters": 1, "max_prompt_adapter_token": 0, "device": "auto", "num_scheduler_steps": 1,
    "multi_step_stream_outputs": True, "ray_workers_use_nsight": False, "num_gpu_blocks_override": None,
    "num_lookahead_slots": 0, "model_loader_extra_config": {}, "ignore_patterns": None, "preemption_mode": None,
    "scheduler_delay_factor": 0.0, "enable_chunked_prefill": None, "disable_chunked_mm_input": False,
    "disable_hybrid_kv_cache_manager": False, "guided_decoding_backend": "auto",
    "guided_decoding_disable_fallback": False, "guided_decoding_disable_any_whitespace": False,
    "guided_decoding_disable_additional_properties": False, "logits_processor_pattern": None,
    "speculative_config": None, "qlora_adapter_name_or_path": None, "show_hidden_metrics_for_version": None,
    "otlp_traces_endpoint": None, "collect_detailed_traces": None, "disable_async_output_proc": False,
    "scheduling_policy": "fcfs", "scheduler_cls": "vllm.core.scheduler.Scheduler", "override_neuron_config": {},
    "override_pooler_config": None, "compilation_config": {}, "worker_cls": "auto", "worker_extension_cls": "",
    "kv_transfer_config": None, "kv_events_config": None, "generation_config": "auto", "enable_sleep_mode": False,
    "override_generation_config": {}, "model_impl": "auto", "override_attention_dtype": None,
    "calculate_kv_scales": False, "additional_config": {}, "enable_reasoning": None, "reasoning_parser": "",
    "use_tqdm_on_load": True, "pt_load_map_location": "cpu", "enable_multimodal_encoder_data_parallel": False,
}

# Fields pagedllm implements: a non-default value, what it must change in the engine config, and the other
# arguments it needs, if any.
WORKS = {
    "served_model_name": ("smol", lambda c: c.model_config.served_model_name == "smol"),
    "tokenizer": ("__model__", lambda c: c.model_config.tokenizer.endswith(".gguf")),
    "task": ("embed", lambda c: c.model_config.task == "embed" and c.model_config.runner_type == "pooling"),
    "override_pooler_config": ({"pooling_type": "MEAN"}, lambda c: c.model_config.pooler_config.pooling_type == "MEAN",
                               {"task": "embed"}),
    "skip_tokenizer_init": (True, lambda c: c.model_config.skip_tokenizer_init),
    "load_format": ("gguf", lambda c: c.model_config.format == "gguf"),
    "config_format": ("hf", lambda c: c.model_config.hf_config is not None),
    "dtype": ("bfloat16", lambda c: c.model_config.dtype == torch.bfloat16),
    "seed": (7, lambda c: c.model_config.seed == 7),
    "max_model_len": (256, lambda c: c.model_config.max_model_len == 256),
    "distributed_executor_backend": ("uni", lambda c: c.parallel_config.distributed_executor_backend == "uni"),
    "pipeline_parallel_size": (2, lambda c: c.parallel_config.pipeline_parallel_size == 2),
    "tensor_parallel_size": (3, lambda c: c.parallel_config.tensor_parallel_size == 3),
    "block_size": (32, lambda c: c.cache_config.block_size == 32),
    "enable_prefix_caching": (False, lambda c: not c.cache_config.enable_prefix_caching),
    "swap_space": (1, lambda c: c.cache_config.swap_space == 1),
    "speculative_config": ({"method": "ngram", "num_speculative_tokens": 2},
                           lambda c: c.speculative_config.num_speculative_tokens == 2),
    "gpu_memory_utilization": (0.5, lambda c: c.cache_config.gpu_memory_utilization == 0.5),
    "max_num_batched_tokens": (9000, lambda c: c.scheduler_config.max_num_batched_tokens == 9000),
    "max_num_seqs": (8, lambda c: c.scheduler_config.max_num_seqs == 8),
    "max_logprobs": (5, lambda c: c.model_config.max_logprobs == 5),
    "disable_log_stats": (True, lambda c: c.observability_config.disable_log_stats),
    "quantization": ("int8", lambda c: c.model_config.quantization == "int8"),
    "enforce_eager": (True, lambda c: c.model_config.enforce_eager),
    "cuda_graph_sizes": ([1, 2], lambda c: c.model_config.cuda_graph_sizes == (1, 2)),
    "device": ("cpu", lambda c: c.device_config.device == "cpu"),
    "num_gpu_blocks_override": (32, lambda c: c.cache_config.num_gpu_blocks_override == 32),
    "preemption_mode": ("swap", lambda c: c.scheduler_config.preemption_mode == "swap"),
    "enable_chunked_prefill": (True, lambda c: c.scheduler_config.enable_chunked_prefill),
    "guided_decoding_backend": ("xgrammar", lambda c: True),  # xgrammar is what "auto" picks too
    "otlp_traces_endpoint": ("http://127.0.0.1:4317",
                             lambda c: c.observability_config.otlp_traces_endpoint == "http://127.0.0.1:4317"),
    "scheduling_policy": ("priority", lambda c: c.scheduler_config.policy == "priority"),
    "generation_config": ("vllm", lambda c: c.model_config.generation_config == "vllm"),
    "model_impl": ("vllm", lambda c: True),  # pagedllm's own implementation, as "auto"
    "enable_sleep_mode": (True, lambda c: c.model_config.enable_sleep_mode),
    "num_scheduler_steps": (4, lambda c: c.scheduler_config.num_scheduler_steps == 4),
    "multi_step_stream_outputs": (False, lambda c: not c.scheduler_config.multi_step_stream_outputs,
                                  {"num_scheduler_steps": 4}),
    "enable_prompt_embeds": (True, lambda c: c.model_config.enable_prompt_embeds),
    "enable_lora": (True, lambda c: c.lora_config.max_loras == 1 and c.scheduler_config.max_loras == 1),
    # The other LoRA fields act with enable_lora (tests/lora/test_lora_config.py), as in vLLM.
    "max_loras": (2, lambda c: c.lora_config is None),
    "max_lora_rank": (8, lambda c: c.lora_config is None),
    "max_cpu_loras": (2, lambda c: c.lora_config is None),
    "lora_dtype": ("bfloat16", lambda c: c.lora_config is None),
}


def field_default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def non_default(default):
    """Some other value of the default's type (for the fields whose value alone is checked)."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 1
    if isinstance(default, dict):
        return {"key": 1}
    if isinstance(default, list):
        return [8]
    return "other"


def test_every_vllm_field_exists_with_vllms_default():
    ours = {f.name: field_default(f) for f in dataclasses.fields(EngineArgs)}
    missing = [name for name in VLLM_FIELDS if name not in ours]
    assert not missing
    assert {name: ours[name] for name in VLLM_FIELDS} == VLLM_FIELDS


def test_every_vllm_field_is_implemented_inert_or_refused_and_only_one():
    for name in VLLM_FIELDS:
        kinds = [name in WORKS, name in INERT, name in UNSUPPORTED and name not in WORKS]
        assert sum(kinds) == 1 or name == "model", name


@pytest.mark.parametrize("name", [n for n in VLLM_FIELDS if n != "model"])
def test_a_non_default_value_works_or_raises_naming_the_field(name, default_model):
    value, check, *context = WORKS.get(name, (non_default(VLLM_FIELDS[name]), None))
    value = default_model if value == "__model__" else value
    args = EngineArgs(**{name: value}, **(context[0] if context else {}))
    if name in WORKS:
        assert check(args.create_engine_config())
    elif name in INERT:
        args.create_engine_config()
    else:
        with pytest.raises(ValueError, match=rf"^{name}=.* is not supported"):
            args.create_engine_config()


def test_none_for_vllms_optional_llm_arguments_means_the_default():
    # vLLM's LLM() passes these as None when the user leaves them out.
    config = EngineArgs(seed=None, hf_overrides=None, compilation_config=None,
                        override_pooler_config=None, mm_processor_kwargs=None).create_engine_config()
    assert config.model_config.seed == 0


def test_an_unknown_task_lists_the_valid_ones():
    with pytest.raises(ValueError, match="auto, generate, .*embed, classify, score, reward"):
        EngineArgs(task="summarize").create_engine_config()


@pytest.mark.parametrize("name, value, reason", [
    ("fully_sharded_loras", True, "LoRA weights split over tensor-parallel ranks as their base layers do"),
    ("num_lookahead_slots", 4, "speculative_config"),
    ("load_format", "safetensors", "for this model"),
])
def test_features_not_implemented_raise_with_their_reason(name, value, reason):
    with pytest.raises(ValueError, match=f"{name}=.*not supported.*{reason}"):
        EngineArgs(**{name: value}).create_engine_config()


def test_serve_has_one_flag_per_field_parsing_to_the_default():
    args = build_parser().parse_args(["serve"])
    for name, default in VLLM_FIELDS.items():
        assert getattr(args, name) == default, name


def test_flags_of_dict_and_list_fields_take_json():
    args = build_parser().parse_args(["serve", "--hf-overrides", '{"rope_theta": 1.0}', "--cuda-graph-sizes",
                                      "[1, 2]", "--no-use-v2-block-manager", "--kv-cache-dtype", "fp8"])
    engine_args = EngineArgs.from_cli_args(args)
    assert engine_args.hf_overrides == {"rope_theta": 1.0}
    assert engine_args.cuda_graph_sizes == [1, 2]
    assert engine_args.use_v2_block_manager is False
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8' is not supported"):
        engine_args.create_engine_config()


def test_the_docs_table_lists_exactly_the_inert_fields():
    path = os.path.join(os.path.dirname(__file__), "..", "docs", "engine_args.md")
    with open(path) as f:
        rows = [line.split("|")[1].strip().strip("`") for line in f if line.startswith("| `")]
    assert sorted(rows) == sorted(INERT)


def test_llm_takes_every_field_at_its_default(tiny_model_dir):
    from pagedllm import LLM

    defaults = {name: default for name, default in VLLM_FIELDS.items() if name != "model"}
    llm = LLM(tiny_model_dir, **{**defaults, "num_gpu_blocks_override": 32})
    assert llm.llm_engine.get_model_config().path == tiny_model_dir
