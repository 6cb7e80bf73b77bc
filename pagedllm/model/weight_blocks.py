"""Find whether a float32 weight is exactly a GGUF-style block-quantized one, and pack it so for packed_linear.c.

A GGUF file's Q4_1 tensor dequantizes to d * q + m and its Q8_0 tensor to d * q, with a float16 d (and m) per
block of 32 weights of a row and a 4-bit (8-bit) q. The loader hands the model those float32 values; streaming
them costs 32 bits a weight at decode, where the blocks cost 5 (8.5). So before a weight is packed in float32
panels, `pack_blocks` looks for its blocks: per block it derives d (and m) from the block's extremes, rounds
every weight to its code, and keeps the form only if decoding gives back every weight bit for bit. Nothing
depends on where the weight came from, and a weight that is not exactly blocks (safetensors, a sharded block,
bfloat16 rounding) stays float32.
"""
from __future__ import annotations

import functools
from typing import Callable, Optional

import torch

BLOCK = 32  # weights of a row per block, as in GGUF
Q4_BYTES = 20  # a 4-bit block's bytes per output column: d and m (float16), 32 codes of 4 bits
_NEIGHBOURS = (0, 1, -1, 2, -2)  # float16 steps from the first guess of d that are tried


def pack_blocks(weight: torch.Tensor, panel: int, bfloat16_inputs: bool = False) -> Optional[torch.Tensor]:
    """The float32 weight [out, in] as 4-bit blocks, else as 8-bit blocks, packed [out / panel, in / BLOCK,
    block bytes] in the layout packed_linear.c reads; None where it is exactly neither (or out is not whole
    panels, or in not whole blocks). With `bfloat16_inputs`, 4-bit codes are laid out for the kernel that
    multiplies them with inputs rounded to bfloat16 (packed_linear_blocks_bf16)."""
    out, k = weight.shape
    if weight.dtype != torch.float32 or out % panel or k % BLOCK:
        return None
    blocks = weight.reshape(out, k // BLOCK, BLOCK)
    for find, pack in ((_q4, functools.partial(_pack_q4, bfloat16_inputs=bfloat16_inputs)), (_q8, _pack_q8)):
        # The first row alone first: a weight that is not blocks (a float32 checkpoint's) is refused at the cost
        # of one row, not of trying every candidate d on all of it (1.2-1.6 s for a 49152 x 576 weight).
        if find(blocks[:1]) is None:
            continue
        found = find(blocks)
        if found is not None:
            return pack(panel, *found)
    return None


def _q4(blocks: torch.Tensor) -> Optional[tuple[torch.Tensor, ...]]:
    """(d, m, q) with blocks == d * q + m exactly, q in [0, 15]; m is each block's least weight."""
    low = blocks.amin(-1)
    if not torch.equal(low.half().float(), low):
        return None
    high = blocks.amax(-1)
    found = _search((high - low) / 15, lambda d: ((blocks - low[..., None]) / d[..., None]).round().clamp(0, 15),
                    lambda d, q: d[..., None] * q + low[..., None], blocks)
    return None if found is None else (found[0], low.half(), found[1].to(torch.uint8))


def _q8(blocks: torch.Tensor) -> Optional[tuple[torch.Tensor, ...]]:
    """(d, q) with blocks == d * q exactly, q in [-128, 127]."""
    found = _search(blocks.abs().amax(-1) / 127, lambda d: (blocks / d[..., None]).round().clamp(-128, 127),
                    lambda d, q: d[..., None] * q, blocks)
    return None if found is None else (found[0], found[1].to(torch.int8))


def _search(guess: torch.Tensor, encode: Callable[[torch.Tensor], torch.Tensor],
            decode: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
            blocks: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """Per block, the first float16 d near `guess` (in _NEIGHBOURS steps) whose codes decode to the block bit
    for bit: (d as float16, codes as float32), or None where some block has none. Blocks of equal weights take
    d = 0 (codes 0)."""
    first = guess.half()
    d = codes = missing = None
    bits = first.view(torch.int16)
    for step in _NEIGHBOURS:
        candidate = torch.where(first == 0, first, (bits + step).view(torch.float16))
        zero = candidate == 0
        q = encode(candidate.masked_fill(zero, 1).float())
        if zero.any():
            q.masked_fill_(zero[..., None], 0)
        match = (decode(candidate.float(), q).view(torch.int32) == blocks.view(torch.int32)).all(-1)
        if missing is None:  # the first guess, which usually fits every block
            if match.all():
                return candidate, q
            d, codes, missing = candidate, q, ~match
            continue
        match &= missing
        d = torch.where(match, candidate, d)
        codes = torch.where(match[..., None], q, codes)
        missing &= ~match
        if not missing.any():
            return d, codes
    return None


def _pack_q4(panel: int, d: torch.Tensor, m: torch.Tensor, q: torch.Tensor, bfloat16_inputs: bool) -> torch.Tensor:
    """Per panel and block: the panel's d, its m (float16), then the panel's codes: per pair of steps of k, a
    byte per column with the first step's code in its low half; or, for `bfloat16_inputs`, per group of four
    pairs (i = 4 g + s), a 32-bit word per column with pair i's first code at bit 4 s and its second at bit
    16 + 4 s, so that shifting a word by 4 s and masking gives the pair as two 16-bit integers."""
    out, blocks = d.shape
    codes = q.view(out, blocks, BLOCK // 2, 2)
    if bfloat16_inputs:
        pairs = codes.view(out, blocks, BLOCK // 8, 4, 2).to(torch.int64)
        shifts = 4 * torch.arange(4)
        words = (pairs[..., 0] << shifts) | (pairs[..., 1] << (shifts + 16))
        words = words[..., 0] | words[..., 1] | words[..., 2] | words[..., 3]  # [out, blocks, groups], 32 bits
        packed_codes = _by_panel(words.to(torch.int32).view(torch.uint8).view(out, blocks, BLOCK // 8, 4), panel)
    else:
        packed_codes = _by_panel((codes[..., 0] | (codes[..., 1] << 4)).unsqueeze(-1), panel)
    return torch.cat([_by_panel(d.view(torch.uint8).view(out, blocks, 1, 2), panel),
                      _by_panel(m.view(torch.uint8).view(out, blocks, 1, 2), panel), packed_codes], dim=-1).contiguous()


def _pack_q8(panel: int, d: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Per panel and block: the panel's d (float16), then per step of k the panel's codes."""
    out, blocks = d.shape
    return torch.cat([_by_panel(d.view(torch.uint8).view(out, blocks, 1, 2), panel),
                      _by_panel(q.view(torch.uint8).view(out, blocks, BLOCK, 1), panel)], dim=-1).contiguous()


def _by_panel(values: torch.Tensor, panel: int) -> torch.Tensor:
    """[out, blocks, steps, bytes] per output column -> [out / panel, blocks, steps * panel * bytes]: each step's
    values of a panel's columns side by side."""
    out, blocks, steps, size = values.shape
    grouped = values.reshape(out // panel, panel, blocks, steps, size).permute(0, 2, 3, 1, 4)
    return grouped.reshape(out // panel, blocks, steps * panel * size)
