"""Llama-family decoder (Llama, SmolLM2, Qwen2 with QKV biases, Mistral) over a paged KV cache."""
from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.model.attention import AttentionMetadata, KVCache, paged_attention
from pagedllm.model.layers import Linear, MergedLinear, RMSNorm, RotaryEmbedding

CosSin = tuple[torch.Tensor, torch.Tensor]


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

    def forward(self, cos_sin: CosSin, x: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        """cos_sin of the step's positions, x [T, hidden] -> [T, hidden]."""
        qkv = self.qkv_proj(x)
        num_qk = (self.num_heads + self.num_kv_heads) * self.head_dim
        # q and k are adjacent in the merged output: one rotation covers both.
        qk = RotaryEmbedding.apply(qkv[:, :num_qk].view(-1, self.num_heads + self.num_kv_heads, self.head_dim),
                                   cos_sin)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, num_qk:].view(-1, self.num_kv_heads, self.head_dim)
        out = paged_attention(q, k, v, kv_cache, meta, self.scale)
        return self.o_proj(out.flatten(1))


class LlamaMLP(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        size = config.intermediate_size
        self.gate_up_proj = MergedLinear(config.hidden_size, [size, size])
        self.down_proj = Linear(size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate).mul_(up))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, cos_sin: CosSin, x: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        x = x + self.self_attn(cos_sin, self.input_layernorm(x), kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


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
        x = input_embeds
        cos_sin = self.rotary.lookup(positions, x.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches):
            x = layer(cos_sin, x, kv_cache, meta)
        return self.norm(x)

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
