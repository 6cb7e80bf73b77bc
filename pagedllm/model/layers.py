"""Building blocks of decoder models: RMSNorm, rotary embeddings and linear layers with merged shards.
On CPU in float32 the element-wise steps run as C kernels (cpu_kernels.py), with PyTorch as the fallback.

A merged linear layer (QKV, gate-up) holds several logical projections in one weight so that one matmul
computes them all; `load_shard` places each checkpoint tensor in its rows, which is also the seam where
tensor-parallel slicing and LoRA deltas attach. Once loaded, a layer may change how it multiplies:
`quantize_int8` turns it into weight-only int8 (one scale per output row; activations stay in the model's
dtype), `pack_for_cpu` reorders a float32 weight into oneDNN's blocked layout, `pack_panels` packs a float32 or
int8 weight in panels for the C kernel packed_linear.c, rounding a float32 one to bfloat16 first if asked, and
`pack_blocks` packs a float32 weight that is exactly 4- or 8-bit blocks (weight_blocks.py) as those blocks
(4-bit ones multiplying inputs rounded to bfloat16 where asked and the CPU has AVX512_BF16).
"""
from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.model.cpu_kernels import layer_ops_for, load_packed_linear, replayable
from pagedllm.model.weight_blocks import Q4_BYTES, pack_blocks


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> Any:
        """norm(x); given the residual stream, adds x to it first and returns (normed, new residual), one
        pass on CPU, where the residual is updated in place."""
        ops = layer_ops_for(x)
        if ops is not None:
            normed = ops.add_rms_norm(x, residual, self.weight, self.eps)
            return normed if residual is None else (normed, residual)
        if residual is None:
            return self._norm(x)
        residual = residual + x
        return self._norm(residual), residual

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused kernel instead of five
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class MergedLinear(nn.Module):
    """y = x W^T (+ b) where W stacks the row blocks of several projections of sizes `output_sizes`."""

    def __init__(self, input_size: int, output_sizes: Sequence[int], bias: bool = False) -> None:
        super().__init__()
        self.input_size, self.output_sizes = input_size, list(output_sizes)
        self.weight = nn.Parameter(torch.empty(sum(output_sizes), input_size), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(sum(output_sizes)), requires_grad=False) if bias else None
        self.scales: Optional[torch.Tensor] = None  # per output row, once quantized to int8
        self.packed_weight: Optional[torch.Tensor] = None  # oneDNN layout, once packed for the CPU
        # [out / panel, in, panel] once packed in panels; uint8 [out / panel, in / 32, block bytes] in blocks
        self.panel_weight: Optional[torch.Tensor] = None
        self.bfloat16_inputs = False  # 4-bit blocks that multiply the input rounded to bfloat16 (pack_blocks)
        self.lora: Any = None  # the LoRA slots' updates (pagedllm/lora/layers.py), once LoRA is enabled

    def load_shard(self, shard: int, name: str, tensor: torch.Tensor) -> None:
        start = sum(self.output_sizes[:shard])
        target = self.weight if name == "weight" else self.bias
        target.data[start:start + self.output_sizes[shard]].copy_(tensor)

    def quantize_int8(self) -> None:
        """Symmetric per-row int8 weights; activations stay in the model's dtype."""
        dtype, weight = self.weight.dtype, self.weight.data.float()
        scales = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        self.weight = nn.Parameter(torch.round(weight / scales.unsqueeze(1)).to(torch.int8), requires_grad=False)
        self.scales = scales.to(dtype)

    def pack_for_cpu(self) -> None:
        """Reorder the float32 weight once into oneDNN's blocked layout and drop the dense copy; the loader
        does so where oneDNN was measured fastest for this shape (linear_backend.py)."""
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(self.weight.data, None)
        self.weight = None

    def pack_panels(self, bfloat16: bool = False) -> bool:
        """Pack the float32 or int8 weight in panels for packed_linear.c and drop the dense copy; with
        `bfloat16`, a float32 weight is rounded to bfloat16 first (half the bytes streamed per token; the
        kernel widens it to float32 as it loads). False, and nothing changes, where the kernel cannot be built
        or the output size is not a multiple of its panel."""
        kernel = load_packed_linear()
        if kernel is None or self.weight.shape[0] % kernel.panel != 0:
            return False
        weight = self.weight.data.to(torch.bfloat16) if bfloat16 and self.scales is None else self.weight.data
        self.panel_weight = kernel.pack(weight)
        self.weight = None
        return True

    def pack_blocks(self, bfloat16: bool = False) -> bool:
        """Pack the float32 weight as 4- or 8-bit blocks for packed_linear.c, and drop the dense copy, where it
        is exactly such blocks (a GGUF file's Q4_1 and Q8_0 tensors, dequantized): the kernel gives the same
        outputs, bit for bit, as from float32 panels, from a fifth or a quarter of the bytes. With `bfloat16`
        (dtype=bfloat16), 4-bit blocks multiply the input rounded to bfloat16 where the kernel has AVX512_BF16's
        dot products for them; other blocks keep their float32 products (their exact values stream in fewer
        bytes than bfloat16 ones). False, and nothing changes, where the weight is not blocks, or where this
        build of the kernel has no block formats."""
        kernel = load_packed_linear()
        if kernel is None or kernel.blocks is None or self.scales is not None:
            return False
        bfloat16 = bfloat16 and kernel.blocks_bf16 is not None
        blocks = pack_blocks(self.weight.data, kernel.panel, bfloat16_inputs=bfloat16)
        if blocks is None:
            return False
        self.panel_weight, self.weight = blocks, None
        self.bfloat16_inputs = bfloat16 and blocks.shape[2] == Q4_BYTES * kernel.panel
        return True

    @property
    def in_blocks(self) -> bool:
        """Whether the weight is packed as 4- or 8-bit blocks (pack_blocks)."""
        return self.panel_weight is not None and self.panel_weight.dtype == torch.uint8

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weight as held (dense, packed, in panels or blocks, int8 with its scales): what each
        decode step reads of this layer."""
        held = (self.panel_weight, self.packed_weight, self.weight, self.scales)
        return sum(t.numel() * t.element_size() for t in held if t is not None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.panel_weight is not None and self.bias is None:
            y = self._product(x)  # one C kernel call, which a CPU graph records as such
        else:
            y = replayable(lambda: self._product(x))  # PyTorch operators, which a CPU graph reruns as one step
        return y if self.lora is None else self.lora.add_to(x, y)

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed_weight is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")
        rows = x.reshape(-1, x.shape[-1])
        if self.panel_weight is not None:
            kernel = load_packed_linear()
            if self.scales is not None:
                y = kernel.int8(rows, self.panel_weight, self.scales)
            elif self.in_blocks:
                y = (kernel.blocks_bf16 if self.bfloat16_inputs else kernel.blocks)(rows, self.panel_weight)
            elif self.panel_weight.dtype == torch.bfloat16:
                y = kernel.bfloat16(rows, self.panel_weight)
            else:
                y = kernel.float32(rows, self.panel_weight)
        elif self.scales is None:
            return F.linear(x, self.weight, self.bias)
        else:
            y = torch.ops.aten._weight_int8pack_mm(rows, self.weight, self.scales.to(x.dtype))
        y = y.view(*x.shape[:-1], y.shape[-1])
        return y if self.bias is None else y + self.bias


def linear_weight_bytes(model: nn.Module) -> int:
    """Bytes of weights a decode step of `model` reads from its linear layers and LM head (an embedding lookup
    reads one row)."""
    return sum(m.weight_bytes for m in model.modules() if isinstance(m, MergedLinear))


class RotaryEmbedding(nn.Module):
    """Rotary position embedding in Hugging Face's half-split layout, with a cos/sin table row per position.

    The sine's first half is stored negated so that rotating is one concatenation and one multiply-add."""

    def __init__(self, head_dim: int, max_position: int, rope_parameters: Optional[dict[str, Any]]) -> None:
        super().__init__()
        params = rope_parameters or {}
        base = float(params.get("rope_theta", 10000.0))
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        inv_freq = _scale_inv_freq(inv_freq, params)
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", torch.cat([freqs.cos(), freqs.cos()], dim=-1), persistent=False)
        self.register_buffer("sin", torch.cat([-freqs.sin(), freqs.sin()], dim=-1), persistent=False)

    def at(self, positions: torch.Tensor) -> RotaryPositions:
        """The rotary embedding of a step's token positions [T]."""
        return RotaryPositions(self.cos, self.sin, positions)

    @staticmethod
    def apply(x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x [T, heads, d] rotated: x * cos + rotate_half(x) * sin."""
        cos, sin = cos_sin
        half = x.shape[-1] // 2
        return torch.addcmul(x * cos, torch.cat([x[..., half:], x[..., :half]], dim=-1), sin)


class RotaryPositions:
    """One step's token positions [T] with the rotary tables [max_position, d], shared by every layer. The C
    kernel reads each position's table row itself; PyTorch looks them up once per step, on first use."""

    def __init__(self, cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor) -> None:
        self.cos_table, self.sin_table, self.positions = cos_table, sin_table, positions

    @functools.cached_property
    def cos_sin(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin [T, 1, d] of the positions."""
        return self.cos_table[self.positions].unsqueeze(1), self.sin_table[self.positions].unsqueeze(1)


def _scale_inv_freq(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Apply the rope scalings of the supported model families (none, linear, llama3)."""
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(params["factor"])
    if kind == "llama3":
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old_len = params["original_max_position_embeddings"]
        wavelen = 2 * torch.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        medium = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        return torch.where(medium, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    raise ValueError(f"rope scaling type {kind!r} is not supported.")
