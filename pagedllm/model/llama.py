"""Llama-family decoder (Llama, SmolLM2, Qwen2 with QKV biases, Mistral) over a paged KV cache, whole or as one
rank's shard: its tensor-parallel slice of one pipeline stage's layers (pagedllm/distributed)."""
from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.distributed import SINGLE_PROCESS, IntermediateTensors, ParallelContext, TensorParallelGroup
from pagedllm.distributed.partition import even_slice, head_dim, kv_head_slice, layer_slice
from pagedllm.model.attention import AttentionMetadata, KVCache, paged_attention, store_rotated_kv
from pagedllm.model.cpu_kernels import layer_ops_for
from pagedllm.model.greedy_head import GreedyHead
from pagedllm.model.layers import RMSNorm, RotaryEmbedding, RotaryPositions
from pagedllm.model.parallel_layers import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                                            parallel_lm_head)
from pagedllm.sample.sampler import row_max


def _rope_parameters(config: Any) -> dict:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    params = dict(params)
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return params


class LlamaAttention(nn.Module):
    """Attention over this rank's query heads and the KV heads they read (its KV cache holds only those)."""

    def __init__(self, config: Any, tp: TensorParallelGroup) -> None:
        super().__init__()
        self.head_dim = d = head_dim(config)
        first_head, self.num_heads = even_slice(config.num_attention_heads, tp.rank, tp.size)
        first_kv_head, self.num_kv_heads = kv_head_slice(config.num_key_value_heads, tp.rank, tp.size)
        bias = bool(getattr(config, "attention_bias", False)) or config.model_type == "qwen2"
        q_rows, kv_rows = (first_head * d, self.num_heads * d), (first_kv_head * d, self.num_kv_heads * d)
        self.qkv_proj = ColumnParallelLinear(config.hidden_size, [q_rows, kv_rows, kv_rows], bias=bias)
        self.o_proj = RowParallelLinear(q_rows, config.hidden_size, tp)
        self.scale = d ** -0.5

    def forward(self, rotary: RotaryPositions, x: torch.Tensor, kv_cache: KVCache,
                meta: AttentionMetadata) -> torch.Tensor:
        """x [T, hidden] at the step's rotary positions -> [T, hidden]."""
        qkv = self.qkv_proj(x).view(x.shape[0], -1, self.head_dim)
        q, k, v = store_rotated_kv(qkv, self.num_heads, rotary, kv_cache, meta)
        out = paged_attention(q, k, v, kv_cache, meta, self.scale)
        return self.o_proj(out.flatten(1))


class LlamaMLP(nn.Module):
    def __init__(self, config: Any, tp: TensorParallelGroup) -> None:
        super().__init__()
        rows = even_slice(config.intermediate_size, tp.rank, tp.size)
        self.gate_up_proj = ColumnParallelLinear(config.hidden_size, [rows, rows])
        self.down_proj = RowParallelLinear(rows, config.hidden_size, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        ops = layer_ops_for(gate_up)
        if ops is not None:
            return self.down_proj(ops.silu_and_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate).mul_(up))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: Any, tp: TensorParallelGroup) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, tp)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config, tp)

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
    """The decoder, or one rank's shard of it: its pipeline stage's layers (the embedding on the first stage,
    the final norm and LM head on the last), each split over the stage's tensor-parallel ranks."""

    def __init__(self, config: Any, parallel: ParallelContext = SINGLE_PROCESS) -> None:
        super().__init__()
        self.config, self.parallel = config, parallel
        ranks, tp = parallel.ranks, parallel.tp
        self.first_layer, num_layers = layer_slice(config.num_hidden_layers, ranks.pp_rank, ranks.pp_size)
        self.embed_tokens = (VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
                             if ranks.is_first_stage else None)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, tp) for _ in range(num_layers))
        self.rotary = RotaryEmbedding(head_dim(config), config.max_position_embeddings, _rope_parameters(config))
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.norm, self.lm_head = None, None
        if ranks.is_last_stage:
            self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.lm_head = parallel_lm_head(config.vocab_size, config.hidden_size, tp)
            if self.tie_word_embeddings and self.embed_tokens is not None:
                self.lm_head.weight = self.embed_tokens.weight
        # Greedy tokens without every logit where the loader could build it (greedy_head.py): CPU, float32
        # activations, one rank.
        self.greedy_head: Optional[GreedyHead] = None
        self.requires_grad_(False)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache],
                meta: AttentionMetadata, residual: Optional[torch.Tensor] = None) -> Any:
        """This stage's layers over hidden [T, hidden] at positions [T]: the input embeddings on the first
        stage, on later ones the previous stage's hidden states and residual stream. Returns the final hidden
        states [T, hidden] on the last stage, else IntermediateTensors for the next. kv_caches: one per local
        layer."""
        rotary = self.rotary.at(positions)
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden, residual = layer(rotary, hidden, residual, kv_cache, meta)
        if self.norm is None:
            return IntermediateTensors(hidden, residual)
        return self.norm(hidden, residual)[0]

    def forward_stage(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache],
                      meta: AttentionMetadata, prompt_embeds: Optional[tuple[torch.Tensor, torch.Tensor]] = None
                      ) -> Optional[torch.Tensor]:
        """One forward pass of this stage with its pipeline traffic: the first stage embeds input_ids [T] (rows
        [R] given as `prompt_embeds` [R, hidden] take those instead), later ones receive the previous stage's
        output. The last stage returns the final hidden states [T, hidden]; the others send theirs to the next
        stage and return None. Every worker of the step calls it."""
        if self.embed_tokens is not None:
            hidden, residual = self.embed(input_ids), None
            if prompt_embeds is not None:
                rows, values = prompt_embeds
                hidden[rows] = values.to(hidden.dtype)
        else:
            hidden, residual = self.parallel.pipeline.recv(self.layers[0].input_layernorm.weight.dtype)
        out = self(hidden, positions, kv_caches, meta, residual)
        if isinstance(out, IntermediateTensors):
            self.parallel.pipeline.send(out)
            return None
        return out

    def compute_logits(self, hidden: torch.Tensor) -> Optional[torch.Tensor]:
        """hidden [N, hidden] -> float32 logits [N, vocab] on the output rank (TP rank 0 of the last stage);
        None on the other ranks of the last stage, which must call it too (they send their vocabulary slice)."""
        logits = self.parallel.tp.gather(self.lm_head(hidden))
        if logits is None:
            return None
        return logits[:, :self.config.vocab_size].float().contiguous()

    def greedy(self, hidden: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """hidden [N, hidden] -> each row's largest logit and its first index (the greedy token), [N] each, as
        row_max gives them over compute_logits (None on the ranks where that is None)."""
        if self.greedy_head is not None:
            return self.greedy_head(hidden)
        logits = self.compute_logits(hidden)
        return None if logits is None else row_max(logits)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face-named tensors into this model, merging split projections; a shard takes its slice
        of each tensor of its stage and skips the others."""
        params = dict(self.named_parameters())
        for name, tensor in weights:
            name = self._local_name(name.removeprefix("model."))
            if name is None:
                continue
            if name in ("embed_tokens.weight", "lm_head.weight"):
                self._load_vocabulary(name, tensor)
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

    def lora_targets(self) -> dict[str, tuple[nn.Module, int]]:
        """Each projection of this stage a LoRA adapter may update, by its checkpoint name
        (`layers.3.self_attn.q_proj`): the merged layer that computes it and its shard there."""
        targets = {}
        for local, layer in enumerate(self.layers):
            for parent in ("self_attn", "mlp"):
                block = getattr(layer, parent)
                for projection, (merged, shard) in _MERGED_SHARDS.items():
                    if hasattr(block, merged):
                        name = f"layers.{self.first_layer + local}.{parent}.{projection}"
                        targets[name] = (getattr(block, merged), shard)
        return targets

    def _local_name(self, name: str) -> Optional[str]:
        """A checkpoint name as this stage's module names it (layers renumbered from the stage's first), or
        None for what the model derives (rotary tables) or another stage holds."""
        if "rotary_emb" in name or (name.startswith("norm.") and self.norm is None):
            return None
        if not name.startswith("layers."):
            return name
        _, index, rest = name.split(".", 2)
        local = int(index) - self.first_layer
        return f"layers.{local}.{rest}" if 0 <= local < len(self.layers) else None

    def _load_vocabulary(self, name: str, tensor: torch.Tensor) -> None:
        """The embedding table and the LM head, where this stage holds them. A tied head shares the embedding's
        table, or, on a last stage without the embedding, loads that table itself."""
        if name == "embed_tokens.weight":
            if self.embed_tokens is not None:
                self.embed_tokens.load_weight(tensor)
            elif self.lm_head is not None and self.tie_word_embeddings:
                self.lm_head.load_shard(0, "weight", tensor)
        elif self.lm_head is not None and not self.tie_word_embeddings:
            self.lm_head.load_shard(0, "weight", tensor)
