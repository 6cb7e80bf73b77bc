"""The float32 linear backends a layer can run on, and how long each takes on this machine (linear_backend.py
chooses by these timings): "panels" (csrc/packed_linear.c), "onednn" (weights prepacked in oneDNN's blocked
layout) and "torch" (F.linear on the dense weight, MKL on CPU)."""
from __future__ import annotations

import glob
import time
from typing import Sequence

import torch
from torch import nn

from pagedllm.model import cpu_kernels
from pagedllm.model.layers import MergedLinear

BACKENDS = ("panels", "onednn", "torch")
ROWS = (1, 8, 256)  # decode of one and of eight sequences, a prefill chunk
_SAMPLES = 16  # calls timed per shape, backend and row count
_MAX_COPIES = 64  # copies of a weight cycled through in decode timings
_DECODE_BYTES = 2 << 20  # a decode call is timed on at most this much of a weight
_PREFILL_COLUMNS = 192  # a prefill call is timed on at most this many output columns

Shape = tuple[int, int]  # (output size, input size) of a weight


def present() -> list[str]:
    """The backends this machine has: the panel kernel where a C compiler built it, oneDNN where torch has it."""
    have = (cpu_kernels.load_packed_linear() is not None, torch.backends.mkldnn.is_available(), True)
    return [name for name, here in zip(BACKENDS, have) if here]


def available(shape: Shape) -> list[str]:
    """The backends that can run a float32 weight of this shape here: the panel kernel needs whole panels."""
    kernel = cpu_kernels.load_packed_linear()
    return [name for name in present() if name != "panels" or shape[0] % kernel.panel == 0]


def pack(module: MergedLinear, backend: str) -> None:
    """Lay the module's float32 weight out for `backend`."""
    if backend == "panels":
        module.pack_panels()
    elif backend == "onednn":
        module.pack_for_cpu()


def measure(shapes: list[Shape]) -> dict[Shape, dict[str, list[float]]]:
    """Seconds per call of each available backend on each shape at each of ROWS rows.

    The machine may be busy with other work, which stretches any call it interrupts (a parallel call waits
    for its slowest thread), at times for a second or more. So every timed call is short, the shapes and
    backends take turns call by call, and each keeps its least time. Decode calls read copies of a slice of
    the weight (at most _DECODE_BYTES of it: memory-bound, their time grows with the bytes), in turn, over
    more memory than the last-level cache, as a model's weights are read; prefill calls multiply at most
    _PREFILL_COLUMNS output columns (compute-bound, their time grows with the columns). Both are scaled up to
    the whole weight."""
    pool = torch.full((2 * _last_level_cache_bytes() // 4,), 0.01)  # the values do not matter
    share = pool.numel() // len(shapes)
    with torch.inference_mode():
        timers = [_ShapeTimer(shape, pool[i * share:(i + 1) * share]) for i, shape in enumerate(shapes)]
        for _ in range(_SAMPLES):
            for timer in timers:
                timer.sample()
    return {timer.shape: timer.best for timer in timers}


class _ShapeTimer:
    """One shape's candidates, on weights in its own stretch of memory, and the least time of each."""

    def __init__(self, shape: Shape, memory: torch.Tensor) -> None:
        self.shape = shape
        out, k = shape
        self.decode_columns = _columns(out, _DECODE_BYTES // (4 * k))
        self.prefill_columns = _columns(out, _PREFILL_COLUMNS)
        copies = max(1, min(_MAX_COPIES, memory.numel() // (self.decode_columns * k)))
        names = available(shape)
        self.decode = {name: _layers(name, memory, self.decode_columns, k, copies, ROWS[:-1]) for name in names}
        self.prefill = {name: _layers(name, memory, self.prefill_columns, k, 1, ROWS[-1:])[0] for name in names}
        self.inputs = [torch.randn(rows, k) for rows in ROWS]
        self.best = {name: [float("inf")] * len(ROWS) for name in names}
        self.calls = 0  # consecutive decode calls read consecutive copies

    def sample(self) -> None:
        """Time one call of each backend at each row count."""
        out = self.shape[0]
        for name, best in self.best.items():
            for i, x in enumerate(self.inputs[:-1]):
                layers = self.decode[name]
                best[i] = min(best[i], _time_call(layers[self.calls % len(layers)], x) * out / self.decode_columns)
                self.calls += 1
            best[-1] = min(best[-1], _time_call(self.prefill[name], self.inputs[-1]) * out / self.prefill_columns)


def _columns(out: int, limit: int) -> int:
    """How many of a weight's `out` output columns to time: all of them, or whole panels up to `limit`."""
    kernel = cpu_kernels.load_packed_linear()
    unit = kernel.panel if kernel is not None else 1
    return min(out, max(unit, limit // unit * unit))


def _layers(backend: str, memory: torch.Tensor, out: int, k: int, copies: int,
            rows: Sequence[int]) -> list[MergedLinear]:
    """`copies` layers of shape (out, k) on consecutive stretches of memory, laid out for `backend`, called
    once with each number of rows they will be timed at (oneDNN builds its kernels on first use)."""
    layers = []
    for i in range(copies):
        layer = MergedLinear(k, [out])
        weight = memory[i * out * k:(i + 1) * out * k]
        if backend == "panels":  # the floats read as an already packed weight
            panel = cpu_kernels.load_packed_linear().panel
            layer.weight, layer.panel_weight = None, weight.view(out // panel, k, panel)
        else:
            layer.weight = nn.Parameter(weight.view(out, k), requires_grad=False)
            pack(layer, backend)
        layers.append(layer)
    for count in rows:
        layers[0](torch.zeros(count, k))
    return layers


def _time_call(layer: MergedLinear, x: torch.Tensor) -> float:
    start = time.perf_counter()
    layer(x)
    return time.perf_counter() - start


def _last_level_cache_bytes() -> int:
    """The largest CPU cache this machine reports (32 MiB where it reports none)."""
    sizes = [32 << 20]
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        with open(path) as f:
            text = f.read().strip()
        sizes.append(int(text[:-1]) << {"K": 10, "M": 20}[text[-1]] if text[-1] in "KM" else int(text))
    return max(sizes)
