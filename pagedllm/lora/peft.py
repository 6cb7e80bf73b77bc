"""Reading an adapter in PEFT's format: `adapter_config.json` and `adapter_model.safetensors` (or `.bin`).

Each targeted projection becomes A [r, in] and B [out, r] with the adapter's scaling folded into B
(lora_alpha / r, or lora_alpha / sqrt(r) under rsLoRA), named as the base checkpoint names the projection
(`layers.3.self_attn.q_proj`). Anything this engine would not apply exactly is refused with a ValueError that
names the problem, so a bad adapter fails its request before any worker sees it.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any

import torch

from pagedllm.distributed.partition import head_dim
from pagedllm.lora.request import LoRARequest

# The projections an adapter may target, as Hugging Face's Llama names them.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(r"^(?:base_model\.model\.)?(?:model\.)?(layers\.(\d+)\.(?:self_attn|mlp)\.(\w+))\."
                  r"lora_([AB])(?:\.default)?\.weight$")


@dataclass
class LoRAWeights:
    """One projection's low-rank update: y += x A^T B^T, the scaling already in B."""

    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]


@dataclass
class LoRAAdapter:
    lora_int_id: int
    rank: int
    weights: dict[str, LoRAWeights]  # checkpoint module name (layers.N.self_attn.q_proj) -> its update


def read_adapter(request: LoRARequest, max_lora_rank: int, hf_config: Any,
                 dtype: torch.dtype = torch.float32) -> LoRAAdapter:
    """The adapter in `request.lora_path`, checked against the model's shapes and `max_lora_rank`."""
    config = _read_config(request.lora_path)
    rank = int(config["r"])
    if rank > max_lora_rank:
        raise ValueError(f"LoRA rank {rank} of adapter {request.lora_name!r} is greater than max_lora_rank "
                         f"{max_lora_rank}.")
    alpha = float(config.get("lora_alpha", rank))
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    tensors = _read_tensors(request.lora_path)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise ValueError(f"Adapter {request.lora_name!r} has weight {key!r}, which targets a module LoRA "
                             f"cannot be applied to here (supported: {', '.join(TARGET_MODULES)}).")
        module, layer, projection, which = match.groups()
        if projection not in TARGET_MODULES:
            raise ValueError(f"Adapter {request.lora_name!r} targets unknown module {projection!r} (supported: "
                             f"{', '.join(TARGET_MODULES)}).")
        if int(layer) >= hf_config.num_hidden_layers:
            raise ValueError(f"Adapter {request.lora_name!r} has weights for layer {layer}, but the model has "
                             f"{hf_config.num_hidden_layers} layers.")
        pairs.setdefault(module, {})[which] = tensor
    weights = {module: _weights(request.lora_name, module, pair, rank, scaling, hf_config, dtype)
               for module, pair in pairs.items()}
    return LoRAAdapter(request.lora_int_id, rank, weights)


def _read_config(path: str) -> dict:
    file = os.path.join(path, "adapter_config.json")
    if not os.path.isfile(file):
        raise ValueError(f"No adapter_config.json in LoRA adapter folder {path!r}.")
    with open(file) as f:
        config = json.load(f)
    targets = config.get("target_modules") or []
    if isinstance(targets, list):
        unknown = sorted(set(targets) - set(TARGET_MODULES))
        if unknown:
            raise ValueError(f"LoRA adapter {path!r} targets unknown module(s) {unknown} (supported: "
                             f"{', '.join(TARGET_MODULES)}).")
    for name, why in (("use_dora", "DoRA"), ("modules_to_save", "modules_to_save"),
                      ("rank_pattern", "rank_pattern"), ("alpha_pattern", "alpha_pattern"),
                      ("fan_in_fan_out", "fan_in_fan_out")):
        if config.get(name):
            raise ValueError(f"LoRA adapter {path!r} uses {why}, which is not supported.")
    if config.get("bias", "none") != "none":
        raise ValueError(f"LoRA adapter {path!r} trains biases (bias={config['bias']!r}); only bias='none' is "
                         "supported.")
    if "r" not in config:
        raise ValueError(f"LoRA adapter {path!r}: adapter_config.json has no rank 'r'.")
    return config


def _read_tensors(path: str) -> dict[str, torch.Tensor]:
    safetensors_file = os.path.join(path, "adapter_model.safetensors")
    bin_file = os.path.join(path, "adapter_model.bin")
    if os.path.isfile(safetensors_file):
        from safetensors.torch import load_file

        return load_file(safetensors_file)
    if os.path.isfile(bin_file):
        return torch.load(bin_file, map_location="cpu", weights_only=True)
    raise ValueError(f"No adapter_model.safetensors or adapter_model.bin in LoRA adapter folder {path!r}.")


def _weights(name: str, module: str, pair: dict[str, torch.Tensor], rank: int, scaling: float, hf_config: Any,
             dtype: torch.dtype) -> LoRAWeights:
    if set(pair) != {"A", "B"}:
        raise ValueError(f"Adapter {name!r} has lora_A without lora_B (or the reverse) for {module!r}.")
    a, b = pair["A"], pair["B"]
    expected_in, expected_out = projection_shape(module.rsplit(".", 1)[-1], hf_config)
    if tuple(a.shape) != (rank, expected_in) or tuple(b.shape) != (expected_out, rank):
        raise ValueError(f"Adapter {name!r}: {module} has lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)}, "
                         f"expected ({rank}, {expected_in}) and ({expected_out}, {rank}) for this model.")
    return LoRAWeights(a.to(dtype).contiguous(), (b.float() * scaling).to(dtype).contiguous())


def projection_shape(projection: str, hf_config: Any) -> tuple[int, int]:
    """(in, out) features of a projection of the model."""
    hidden, d = hf_config.hidden_size, head_dim(hf_config)
    q, kv, mlp = hf_config.num_attention_heads * d, hf_config.num_key_value_heads * d, hf_config.intermediate_size
    return {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
            "gate_proj": (hidden, mlp), "up_proj": (hidden, mlp), "down_proj": (mlp, hidden)}[projection]

