"""BERT encoder (`BertModel`): absolute position and token-type embeddings, bidirectional attention,
post-LayerNorm layers with GELU. It keeps no KV cache: each request's whole prompt runs in one pass.

A step's sequences arrive as one flat token list; the linear layers run on it as it is (no padding), and only
attention lays the sequences out padded to the longest, with padded keys masked.
"""
from __future__ import annotations

from typing import Any, Iterable, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.model.layers import MergedLinear

_ACTIVATIONS = {"gelu": lambda x: F.gelu(x), "gelu_new": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}
# The same activations as oneDNN applies them to a linear layer's output while it is in cache: (attr, algorithm).
_ONEDNN_ACTIVATIONS = {"gelu": ("gelu", "none"), "gelu_new": ("gelu", "tanh"), "relu": ("relu", "")}


class SequenceLayout(NamedTuple):
    """Where each sequence of a flat token list sits in a padded [B, L] layout."""

    batch: int
    length: int
    padded_index: Optional[torch.Tensor]  # [B * L] long: flat row of each padded slot (T for padding); None if equal
    flat_index: Optional[torch.Tensor]  # [T] long: padded slot of each flat token; None if all lengths are equal
    key_mask: Optional[torch.Tensor]  # [B, 1, 1, L] bool: True where a key is a real token

    @classmethod
    def build(cls, seq_lens: list[int], device: torch.device) -> "SequenceLayout":
        batch, length = len(seq_lens), max(seq_lens)
        if all(n == length for n in seq_lens):
            return cls(batch, length, None, None, None)
        total = sum(seq_lens)
        lens = torch.tensor(seq_lens, device=device)
        offsets = torch.cumsum(lens, 0) - lens
        cols = torch.arange(length, device=device)
        real = cols.unsqueeze(0) < lens.unsqueeze(1)  # [B, L]
        padded_index = torch.where(real, offsets.unsqueeze(1) + cols, total).flatten()
        flat_index = (torch.arange(batch, device=device).unsqueeze(1) * length + cols).masked_select(real)
        return cls(batch, length, padded_index, flat_index, real[:, None, None, :])

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """[T, D] -> [B, L, D], zeros in padding."""
        if self.padded_index is None:
            return x.view(self.batch, self.length, -1)
        return torch.cat([x, x.new_zeros(1, x.shape[1])])[self.padded_index].view(self.batch, self.length, -1)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """[B, L, D] -> [T, D]."""
        flat = x.reshape(self.batch * self.length, -1)
        return flat if self.flat_index is None else flat[self.flat_index]


class BertLayer(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.qkv = MergedLinear(hidden, [hidden] * 3, bias=True)  # query, key and value in one matmul
        self.attention_output = MergedLinear(hidden, [hidden], bias=True)
        self.attention_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.intermediate = MergedLinear(hidden, [config.intermediate_size], bias=True)
        self.output = MergedLinear(config.intermediate_size, [hidden], bias=True)
        self.output_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.hidden_act = config.hidden_act

    def forward(self, x: torch.Tensor, layout: SequenceLayout) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]: self-attention over each sequence, then the MLP, each followed by
        its residual add and LayerNorm."""
        qkv = layout.pad(self.qkv(x))  # [B, L, 3 * hidden]
        b, n, _ = qkv.shape
        q, k, v = qkv.view(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)  # each [B, heads, L, d]
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=layout.key_mask)
        attn = layout.unpad(attn.transpose(1, 2).reshape(b, n, -1))
        x = self.attention_norm(_plus_residual(self.attention_output, attn, x))
        return self.output_norm(_plus_residual(self.output, _activated(self.intermediate, x, self.hidden_act), x))


# An encoder step's element-wise passes over its thousands of rows cost about a quarter of its time beside the
# matmuls; on oneDNN-packed weights the activation and the residual add run inside the matmul instead.

def _activated(layer: MergedLinear, x: torch.Tensor, hidden_act: str) -> torch.Tensor:
    """act(layer(x))."""
    if layer.packed_weight is None:
        return _ACTIVATIONS[hidden_act](layer(x))
    attr, algorithm = _ONEDNN_ACTIVATIONS[hidden_act]
    return torch.ops.mkldnn._linear_pointwise(x, layer.packed_weight, layer.bias, attr, [], algorithm)


def _plus_residual(layer: MergedLinear, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual + layer(x)."""
    if layer.packed_weight is None:
        return residual + layer(x)
    return torch.ops.mkldnn._linear_pointwise.binary(x, residual, layer.packed_weight, layer.bias, "add")


class BertModel(nn.Module):
    """The encoder; `forward` returns every token's last hidden state."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        if getattr(config, "position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"BERT position_embedding_type {config.position_embedding_type!r} is not supported; "
                             "only 'absolute'.")
        if config.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"BERT hidden_act {config.hidden_act!r} is not supported; supported: "
                             f"{sorted(_ACTIVATIONS)}.")
        self.config = config
        hidden = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, hidden)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, hidden)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, hidden)
        self.embeddings_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, seq_lens: list[int],
                token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """input_ids and positions [T] for sequences of `seq_lens` laid out one after another -> [T, hidden].
        token_type_ids [T] (a text pair's second text is type 1); None: every token is of type 0."""
        layout = SequenceLayout.build(seq_lens, input_ids.device)
        types = (self.token_type_embeddings.weight[0] if token_type_ids is None
                 else self.token_type_embeddings(token_type_ids))
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions) + types
        x = self.embeddings_norm(x)
        for layer in self.layers:
            x = layer(x, layout)
        return x

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Hugging Face BERT names (with or without the `bert.` prefix); query, key and value merged. The
        checkpoint's `pooler` (a dense layer over [CLS] for next-sentence prediction) is not part of the encoder."""
        params = dict(self.named_parameters())
        for name, tensor in weights:
            name = name.removeprefix("bert.")
            if name.startswith("pooler.") or name.endswith("position_ids"):
                continue
            ours = _rename(name)
            if ours is None:
                raise ValueError(f"Unexpected weight {name!r} in the checkpoint.")
            if ours.startswith("qkv:"):
                _, layer, part, kind = ours.split(":")
                self.layers[int(layer)].qkv.load_shard(_QKV_SHARDS[part], kind, tensor)
            else:
                params[ours].data.copy_(tensor)

    def pack_for_cpu(self) -> None:
        """Lay the linear weights out for oneDNN, which multiplies a step's thousands of rows faster than
        the dense layout (by about a sixth, measured at 2048 rows on the MiniLM shapes)."""
        for module in self.modules():
            if isinstance(module, MergedLinear):
                module.pack_for_cpu()


_QKV_SHARDS = {"query": 0, "key": 1, "value": 2}
_LAYER_NAMES = {"attention.output.dense": "attention_output", "attention.output.LayerNorm": "attention_norm",
                "intermediate.dense": "intermediate", "output.dense": "output", "output.LayerNorm": "output_norm"}


def _rename(name: str) -> Optional[str]:
    """A checkpoint name as this module names it; query/key/value as 'qkv:layer:part:kind' to merge."""
    if name.startswith("embeddings."):
        rest = name.removeprefix("embeddings.")
        return "embeddings_norm." + rest.split(".", 1)[1] if rest.startswith("LayerNorm.") else rest
    if not name.startswith("encoder.layer."):
        return None
    layer, rest = name.removeprefix("encoder.layer.").split(".", 1)
    module, kind = rest.rsplit(".", 1)
    if module.startswith("attention.self."):
        return f"qkv:{layer}:{module.removeprefix('attention.self.')}:{kind}"
    return f"layers.{layer}.{_LAYER_NAMES[module]}.{kind}" if module in _LAYER_NAMES else None
