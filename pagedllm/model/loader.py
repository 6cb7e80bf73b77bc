"""Build a model from its source and load its weights (GGUF dequantized, or safetensors)."""
from __future__ import annotations

import glob
import logging
import os
from typing import Iterator

import torch
from torch import nn

from pagedllm.config import ModelConfig
from pagedllm.distributed import SINGLE_PROCESS, ParallelContext
from pagedllm.model.bert import BertModel
from pagedllm.model.classifiers import BertForSequenceClassification, LlamaForSequenceClassification
from pagedllm.model.cpu_kernels import BF16_FLAGS, cpu_bf16_flags
from pagedllm.model.greedy_head import build_greedy_head
from pagedllm.model.layers import MergedLinear
from pagedllm.model.linear_backend import choose_backends, panels_unless_overridden
from pagedllm.model.linear_timing import pack
from pagedllm.model.llama import LlamaForCausalLM
from pagedllm.pooling.config import is_encoder

logger = logging.getLogger(__name__)

# Architectures served by the Llama-family implementation.
_DECODER_ARCHITECTURES = {"LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM",
                          "LlamaForSequenceClassification"}


def _iter_safetensors(folder: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise ValueError(f"Model folder {folder} has no *.safetensors weight files.")
    for file in files:
        yield from load_file(file).items()


def iter_weights(model_config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's full tensors, in Hugging Face names; each rank of a sharded model reads them all."""
    if model_config.format == "gguf":
        from pagedllm.model.gguf_loader import iter_gguf_weights

        return iter_gguf_weights(model_config.path, model_config.hf_config)
    return _iter_safetensors(model_config.path)


def load_model(model_config: ModelConfig, device: str, parallel: ParallelContext = SINGLE_PROCESS) -> nn.Module:
    """The model with its weights, in model_config.activation_dtype on `device` (on CPU, linear weights in
    model_config.dtype), in inference mode; under tensor or pipeline parallelism (`parallel` from
    pagedllm.distributed.init_distributed), this worker's shard of it."""
    hf_config = model_config.hf_config
    archs = set(getattr(hf_config, "architectures", None) or ["LlamaForCausalLM"])
    if is_encoder(hf_config):
        encoder = (BertForSequenceClassification(hf_config) if "BertForSequenceClassification" in archs
                   else BertModel(hf_config))
        encoder.load_weights(iter_weights(model_config))
        encoder = encoder.to(device=device, dtype=model_config.dtype).eval()
        if device == "cpu" and model_config.dtype == torch.bfloat16 and not cpu_bf16_flags():
            logger.warning("dtype=bfloat16 on a CPU without %s: PyTorch computes in bfloat16 by converting to "
                           "float32 as it goes, slower than float32 here.", " or ".join(BF16_FLAGS))
        if device == "cpu" and model_config.dtype == torch.float32 and torch.backends.mkldnn.is_available():
            encoder.pack_for_cpu()
        return encoder
    if not archs & _DECODER_ARCHITECTURES:
        raise ValueError(f"Model architecture {sorted(archs)} is not supported; supported: "
                         f"{sorted(_DECODER_ARCHITECTURES | {'BertModel', 'BertForSequenceClassification'})}.")
    decoder = LlamaForSequenceClassification if "LlamaForSequenceClassification" in archs else LlamaForCausalLM
    model = decoder(hf_config, parallel)
    model.load_weights(iter_weights(model_config))
    model = model.to(device=device, dtype=model_config.activation_dtype).eval()
    linears = [m for m in model.modules() if isinstance(m, MergedLinear)]
    if model_config.quantization == "int8":
        # The LM head too: it is a fifth of the default model's weights read per token (a tied embedding
        # table stays float32 for the lookup).
        for module in linears:
            module.quantize_int8()
    if device == "cpu" and model_config.activation_dtype == torch.float32:
        # The LM head's float32 weight, which packing drops, for the greedy head built from it once packed.
        head = model.lm_head if model.parallel.tp.size == 1 else None
        head_weight = head.weight.data if head is not None and head.weight is not None else None
        _pack_for_cpu(linears, bfloat16=model_config.dtype == torch.bfloat16)
        if head_weight is not None:
            model.greedy_head = build_greedy_head(head_weight, head)
    if model_config.quantization == "gguf":
        dense = sum(not m.in_blocks for m in linears)
        if dense:
            raise ValueError(f"quantization='gguf': {dense} of the model's {len(linears)} linear weights are not Q4_1 "
                             "or Q8_0 blocks that the CPU kernel streams (other GGUF types, no C compiler, a CPU "
                             "without AVX2 and F16C, or PAGEDLLM_LINEAR_BACKEND naming another backend); leave "
                             "quantization unset to run them dequantized.")
    return model


def _pack_for_cpu(linears: list[MergedLinear], bfloat16: bool) -> None:
    """int8 weights take the panel kernel, which converts them as it streams them; so do float32 ones that are
    exactly 4- or 8-bit blocks (a GGUF file's), which it decodes as it streams them, to the same values, from a
    fifth or a quarter of the bytes (the fastest at decode by far, and as fast as float32 panels at prefill,
    which decode each panel once), unless PAGEDLLM_LINEAR_BACKEND names another backend; where the model's
    dtype is bfloat16 (ModelConfig.activation_dtype), 4-bit blocks multiply inputs rounded to bfloat16 where
    the CPU has AVX512_BF16 (MergedLinear.pack_blocks), and the other float32 weights are rounded to bfloat16
    and take the panel kernel too. The remaining float32 weights take the backend measured fastest on this CPU
    for their shape."""
    for module in linears:
        if module.scales is not None:
            module.pack_panels()
    blocks = panels_unless_overridden()
    float32 = [m for m in linears if m.scales is None and not (blocks and m.pack_blocks(bfloat16))
               and not (bfloat16 and m.pack_panels(bfloat16=True))]
    in_blocks = [m for m in linears if m.in_blocks]
    if bfloat16 and in_blocks:
        logger.info("dtype=bfloat16: %d linear weights stay the GGUF's blocks (fewer bytes than bfloat16 weights); "
                    "%d of them multiply inputs rounded to bfloat16 (4-bit blocks, where the CPU has AVX512_BF16), "
                    "the others keep float32 products.", len(in_blocks), sum(m.bfloat16_inputs for m in in_blocks))
    if bfloat16 and float32:
        logger.warning("%d linear layers stay float32 under dtype=bfloat16: the panel kernel cannot take them (no "
                       "C compiler, or an output size that is not whole panels).", len(float32))
    backends = choose_backends(tuple(m.weight.shape) for m in float32)
    for module in float32:
        pack(module, backends[tuple(module.weight.shape)])
