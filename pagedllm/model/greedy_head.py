"""Greedy tokens through the LM head without computing every logit: an int8 copy of the head gives each logit
approximately, with a bound on its error, and only the vocabulary panels the bounds cannot rule out are computed
exactly, by the layer's own kernel (csrc/greedy_head.c explains the bound). The token and its logit are those of
the full float32 product, bit for bit; on the default model (AMD Zen 4) the head takes 0.40x the time at 64
greedy rows and 0.49x at eight.

The copy holds, per block of 32 weights of a vocabulary row, a float16 scale and int8 codes (for a GGUF Q8_0
head, exactly its own blocks), with the norms the bound needs: per block of the float32 weight, and per row the
larger of the weight's and the copy's (N) and of their difference (|f|), each rounded up. It is built where the
head is packed for packed_linear.c (float32 panels or blocks with float32 products), whole (one tensor-parallel
rank), and finite.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from pagedllm.model.cpu_kernels import load_greedy_head, load_packed_linear
from pagedllm.model.layers import MergedLinear
from pagedllm.sample.sampler import row_max

BLOCK = 32  # weights of a row per scale, as csrc/greedy_head.c's BLOCK
_CODES = 127  # the weights' codes, in [-127, 127]
_FLOAT16_MAX = 65504.0


class GreedyHead(nn.Module):
    """Each row's largest logit and its first index for final hidden states, as row_max over the full logits. A
    module of the model, so that sleep mode releases and restores its copy with the weights."""

    def __init__(self, head: MergedLinear, approx: torch.Tensor, norms: torch.Tensor, weight_errors: torch.Tensor):
        super().__init__()
        self.head = head
        self.register_buffer("approx", approx, persistent=False)
        self.register_buffer("norms", norms, persistent=False)
        self.register_buffer("weight_errors", weight_errors, persistent=False)
        self.max_norm = float(norms.max())
        # One row streams the weights and computes little: the full head is as fast or faster where its bytes are
        # fewer (a Q8_0 head: 30 MB against the copy's 32, 1.00-1.07x the time on an AMD Zen 4; two rows level,
        # four 0.72x, eight 0.49x, 64 0.40x). A float32 head streams 113 MB: 0.35x at one row.
        self.full_for_one_row = head.weight_bytes <= self.nbytes
        self.kernel, _ = load_greedy_head()
        self.panel_row = load_packed_linear().panel_row
        self.block_bytes = head.panel_weight.shape[2] if head.in_blocks else 0

    @property
    def nbytes(self) -> int:
        """Bytes the copy and its norms take beside the head."""
        return sum(t.numel() * t.element_size() for t in self.buffers(recurse=False))

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [rows, hidden] float32 -> (largest logit [rows], its first index [rows] long)."""
        rows, k = hidden.shape
        if rows == 1 and self.full_for_one_row:
            return row_max(self.head(hidden))
        hidden = hidden.contiguous()
        panels, blocks = self.approx.shape[0], self.approx.shape[1]
        codes = torch.empty(rows, k, dtype=torch.int8)
        stats = hidden.new_empty(rows, 3 * blocks + 3)
        bounds = hidden.new_empty(rows, 2 * panels)
        values = hidden.new_empty(rows)
        indices = torch.empty(rows, dtype=torch.long)
        self.kernel(hidden, self.approx, self.norms, self.weight_errors, codes, stats, bounds, values, indices, rows,
                    k, panels, self.panel_row, self.head.panel_weight, self.block_bytes, self.max_norm)
        return values, indices


def build_greedy_head(weight: torch.Tensor, head: MergedLinear) -> Optional[GreedyHead]:
    """The greedy head for `head` (already packed for packed_linear.c), built from its float32 weight [vocab, hidden]
    as loaded; None where the kernels cannot take it (see the module's docstring)."""
    kernel, linear = load_greedy_head(), load_packed_linear()
    packed = head.panel_weight
    if (kernel is None or linear is None or not linear.panel_row or linear.panel != kernel[1] or packed is None
            or head.bias is not None or head.scales is not None or head.bfloat16_inputs
            or packed.dtype not in (torch.float32, torch.uint8)):
        return None
    vocab, k = weight.shape
    if (weight.dtype != torch.float32 or vocab % linear.panel or k % BLOCK or vocab != packed.shape[0] * linear.panel
            or not torch.isfinite(weight).all()):
        return None
    blocks = weight.reshape(vocab, k // BLOCK, BLOCK)
    scales = (blocks.abs().amax(-1) / _CODES).half()
    if not torch.isfinite(scales).all():
        return None
    steps = scales.float().unsqueeze(-1)
    codes = torch.where(steps > 0, (blocks / steps.clamp(min=torch.finfo(torch.float32).tiny)).round(), 0)
    codes = codes.clamp(-_CODES, _CODES)
    copy = (steps * codes).double()
    exact = blocks.double()
    block_norms = _float16_up(exact.norm(dim=-1))
    if block_norms is None:
        return None
    norms = _float32_up(torch.maximum(exact.norm(dim=(1, 2)), copy.norm(dim=(1, 2))))
    weight_errors = _float32_up((exact - copy).norm(dim=(1, 2)))
    approx = _pack(linear.panel, scales, codes.to(torch.int8), block_norms)
    return GreedyHead(head, approx, norms, weight_errors)


def _pack(panel: int, scales: torch.Tensor, codes: torch.Tensor, block_norms: torch.Tensor) -> torch.Tensor:
    """[vocab / panel, blocks, panel * (4 + BLOCK)] bytes, each block of a panel as greedy_head.c reads it: the
    panel's scales and block norms (float16), then per four steps of k each column's four codes, offset by 128
    (unsigned)."""
    vocab, blocks = scales.shape
    panels = vocab // panel

    def by_panel(values: torch.Tensor) -> torch.Tensor:  # [vocab, blocks] 2-byte values -> [panels, blocks, 2 panel]
        return values.view(panels, panel, blocks).transpose(1, 2).contiguous().view(torch.uint8)

    unsigned = (codes.to(torch.int16) + 128).to(torch.uint8)
    quads = unsigned.view(panels, panel, blocks, BLOCK // 4, 4).permute(0, 2, 3, 1, 4)
    return torch.cat([by_panel(scales), by_panel(block_norms), quads.reshape(panels, blocks, BLOCK * panel)],
                     dim=-1).contiguous()


def _float16_up(values: torch.Tensor) -> Optional[torch.Tensor]:
    """Non-negative float64 values as float16, each rounded up (None where one exceeds float16's range)."""
    if values.max() >= _FLOAT16_MAX:
        return None
    half = values.half()
    low = half.double() < values
    return torch.where(low, (half.view(torch.int16) + 1).view(torch.float16), half)


def _float32_up(values: torch.Tensor) -> torch.Tensor:
    """Non-negative float64 values as float32, each rounded up."""
    single = values.float()
    return torch.where(single.double() < values, torch.nextafter(single, torch.tensor(float("inf"))), single)
