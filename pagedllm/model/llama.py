"""Llama-family decoder (Llama, SmolLM2, Qwen2 with QKV biases, Mistral) over a paged KV cache."""
from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.model.attention import AttentionMetadata, KVCache, paged_attention, store_rotated_kv
from pagedllm.model.cpu_kernels import layer_ops_for
from pagedllm.model.layers import Linear, MergedLinear, RMSNorm, RotaryEmbedding, RotaryPositions


def _rope_parameters(config: Any) -> dict:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    params = dict(params)
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return params


class LlamaAttention(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        bias = bool(getattr(config, "attention_bias", False)) or config.model_type == "qwen2"
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = MergedLinear(config.hidden_size, [q_size, kv_size, kv_size], bias=bias)
        self.o_proj = Linear(q_size, config.hidden_size)
        self.scale = self.head_dim ** -0.5

    def forward(self, rotary: RotaryPositions, x: torch.Tensor, kv_cache: KVCache,
                meta: AttentionMetadata) -> torch.Tensor:
        """x [T, hidden] at the step's rotary positions -> [T, hidden]."""
        qkv = self.qkv_proj(x).view(x.shape[0], -1, self.head_dim)
        q, k, v = store_rotated_kv(qkv, self.num_heads, rotary, kv_cache, meta)
        out = paged_attention(q, k, v, kv_cache, meta, self.scale)
        return self.o_proj(out.flatten(1))


class LlamaMLP(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        size = config.intermediate_size
        self.gate_up_proj = MergedLinear(config.hidden_size, [size, size])
        self.down_proj = Linear(size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        ops = layer_ops_for(gate_up)
        if ops is not None:
            return self.down_proj(ops.silu_and_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate).mul_(up))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, rotary: RotaryPositions, x: torch.Tensor, residual: Optional[torch.Tensor], kv_cache: KVCache,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's input, the residual stream before it; None at the first layer) -> the same after it.
        Each residual add happens inside the next norm, which does both in one pass."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(rotary, x, kv_cache, meta)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


# Checkpoint projection name -> (merged module name, shard index).
_MERGED_SHARDS = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
                  "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
                  "o_proj": ("o_proj", 0), "down_proj": ("down_proj", 0)}


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.rotary = RotaryEmbedding(head_dim, config.max_position_embeddings, _rope_parameters(config))
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = Linear(config.hidden_size, config.vocab_size)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.requires_grad_(False)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_embeds: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache],
                meta: AttentionMetadata) -> torch.Tensor:
        """input_embeds [T, hidden], positions [T] -> final hidden states [T, hidden]."""
        x, residual = input_embeds, None
        rotary = self.rotary.at(positions)
        for layer, kv_cache in zip(self.layers, kv_caches):
            x, residual = layer(rotary, x, residual, kv_cache, meta)
        return self.norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> float32 logits [N, vocab]."""
        return self.lm_head(hidden).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face-named tensors into this model, merging split projections."""
        params = dict(self.named_parameters())
        for name, tensor in weights:
            name = name.removeprefix("model.")
            if "rotary_emb" in name:
                continue
            if name == "lm_head.weight":
                if not self.tie_word_embeddings:
                    self.lm_head.load_shard(0, "weight", tensor)
                continue
            parts = name.split(".")
            if len(parts) >= 4 and parts[-2] in _MERGED_SHARDS:
                merged, shard = _MERGED_SHARDS[parts[-2]]
                module = self.get_submodule(".".join(parts[:-2] + [merged]))
                module.load_shard(shard, parts[-1], tensor)
                continue
            if name not in params:
                raise ValueError(f"Unexpected weight {name!r} in the checkpoint.")
            params[name].data.copy_(tensor)
