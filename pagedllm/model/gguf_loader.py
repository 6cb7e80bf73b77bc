"""Read a llama-architecture GGUF file: its config as a transformers LlamaConfig and its weights in HF names."""
from __future__ import annotations

import functools
from typing import Any, Iterator

import numpy as np
import torch


@functools.lru_cache(maxsize=2)
def open_gguf(path: str) -> Any:
    """Parsing a GGUF header takes seconds, so the config and the weights share one reader."""
    import gguf

    return gguf.GGUFReader(path)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def read_gguf_config(path: str) -> Any:
    from pagedllm.model import gguf_cache

    config = gguf_cache.load_config(path)
    if config is None:
        config = _parse_config(path)
        gguf_cache.save_config(path, config)
    return config


def _parse_config(path: str) -> Any:
    from transformers import LlamaConfig

    reader = open_gguf(path)
    arch = _field(reader, "general.architecture")
    if arch not in ("llama", "qwen2", "mistral"):
        raise ValueError(f"GGUF file {path} has architecture {arch!r}; supported: llama, qwen2, mistral.")
    tensor_names = {t.name for t in reader.tensors}
    heads = _field(reader, f"{arch}.attention.head_count")
    hidden = _field(reader, f"{arch}.embedding_length")
    vocab = _field(reader, f"{arch}.vocab_size") or len(_field(reader, "tokenizer.ggml.tokens"))
    return LlamaConfig(
        vocab_size=vocab, hidden_size=hidden,
        intermediate_size=_field(reader, f"{arch}.feed_forward_length"),
        num_hidden_layers=_field(reader, f"{arch}.block_count"),
        num_attention_heads=heads,
        num_key_value_heads=_field(reader, f"{arch}.attention.head_count_kv", heads),
        max_position_embeddings=_field(reader, f"{arch}.context_length", 2048),
        rms_norm_eps=_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        rope_parameters={"rope_type": "default", "rope_theta": _field(reader, f"{arch}.rope.freq_base", 10000.0)},
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
        pad_token_id=_field(reader, "tokenizer.ggml.padding_token_id"),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        head_dim=hidden // heads,
        architectures=["LlamaForCausalLM"],
    )


_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}


def _hf_name(name: str) -> str:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    _, layer, rest = name.split(".", 2)
    return f"model.layers.{layer}.{_LAYER_NAMES[rest]}"


def _unpermute_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp stores q/k rows interleaved for its rotary layout; restore Hugging Face's half-split order."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def iter_gguf_weights(path: str, hf_config: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, float32 tensor) for every tensor, dequantized (or from the cache of a previous start)."""
    from pagedllm.model import gguf_cache

    weights = gguf_cache.load_weights(path)
    if weights is None:
        weights = dict(_dequantize_all(path, hf_config))
        gguf_cache.save_weights(path, weights)
    yield from weights.items()


def _dequantize_all(path: str, hf_config: Any) -> Iterator[tuple[str, torch.Tensor]]:
    from gguf.quants import dequantize

    reader = open_gguf(path)
    for tensor in reader.tensors:
        if tensor.name == "rope_freqs.weight":
            continue
        weights = dequantize(tensor.data, tensor.tensor_type)
        if tensor.name.endswith(("attn_q.weight", "attn_q.bias")):
            weights = _unpermute_rope(weights, hf_config.num_attention_heads)
        elif tensor.name.endswith(("attn_k.weight", "attn_k.bias")):
            weights = _unpermute_rope(weights, hf_config.num_key_value_heads)
        yield _hf_name(tensor.name), torch.from_numpy(np.array(weights, dtype=np.float32))
