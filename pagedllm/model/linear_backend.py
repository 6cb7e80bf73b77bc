"""Which kernel runs each float32 linear layer on this CPU: the panel kernel wherever it can take the weight,
else the faster of the others, chosen by timing them, not by vendor.

The panel kernel (csrc/packed_linear.c) sums each output over its inputs in order, whatever the number of
rows in the call, so a row's result never depends on the batch it runs in (batch invariance, on by default on
CPU); oneDNN and MKL block their sums differently for different numbers of rows (on an AMD Zen 4 whose layers
ran on oneDNN, logprobs moved by up to 2e-5 between batches of 1 and 48). It is also the fastest, or level, at decode on the CPUs measured: an
Intel Xeon (AVX-512), where it beat MKL 1.3-1.7x at 8 to 64 rows (a 2048-row prefill ran 7% slower), and an
AMD Zen 4, where it decoded at 21.2 ms per token against 39.5 for oneDNN.

For the shapes it cannot take (not whole panels), the others are timed on the first start on a CPU, on the
model's own layer shapes (about a second), and the choice is cached on disk beside the compiled kernels,
keyed by the CPU's model and flags, the torch version, the thread count, the kernel sources and the shapes.
`PAGEDLLM_LINEAR_BACKEND=panels|onednn|torch` overrides the choice (onednn and torch give up batch
invariance), for the weights that are exactly 4- or 8-bit blocks too (weight_blocks.py: the panel kernel
takes them as blocks unless another backend is named).

The candidates and their timing are in linear_timing.py. A layer keeps one layout, so each timed shape gets
the candidate with the least time per token summed over three regimes: decode of one sequence (all of a call's
time goes to one token), decode of eight (an eighth each) and a 256-token prefill (a 256th each). Decode
weighs most because every decoded token reads the whole weight from memory, which is where serving spends
its time.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from typing import Iterable, Optional

import torch

from pagedllm.model import cpu_kernels
from pagedllm.model.linear_timing import BACKENDS, ROWS, Shape, available, measure, present

logger = logging.getLogger(__name__)

ENV_VAR = "PAGEDLLM_LINEAR_BACKEND"


def choose_backends(shapes: Iterable[Shape]) -> dict[Shape, str]:
    """The backend each float32 weight shape runs on: PAGEDLLM_LINEAR_BACKEND where set, else the panel kernel
    where it takes the shape, else the cached measurement for this CPU and the other shapes, measured now if
    there is none."""
    shapes = sorted(set(shapes))
    override = os.environ.get(ENV_VAR)
    if override and shapes:
        return _overridden(override, shapes)
    invariant = {shape: "panels" for shape in shapes if "panels" in available(shape)}
    return {**invariant, **_measured([shape for shape in shapes if shape not in invariant])}


def panels_unless_overridden() -> bool:
    """Whether the panel kernel may run any layer: False where PAGEDLLM_LINEAR_BACKEND names another backend."""
    return os.environ.get(ENV_VAR) in (None, "", "panels")


def _measured(shapes: list[Shape]) -> dict[Shape, str]:
    """The fastest backend for each shape, read from the cache or measured now."""
    if not shapes:
        return {}
    path = os.path.join(cpu_kernels.CACHE_ROOT, f"linear-backends-{_cache_key(shapes)}.json")
    choices = _read_choices(path, shapes)
    if choices is None:
        start = time.perf_counter()
        timings = measure(shapes)
        choices = {shape: min(timings[shape], key=lambda name: _per_token(timings[shape][name]))
                   for shape in shapes}
        logger.info("Timed the linear backends on %d layer shapes in %.1f s: %s", len(shapes),
                    time.perf_counter() - start, {f"{o}x{i}": choice for (o, i), choice in choices.items()})
        _write_choices(path, choices, timings)
    return choices


def _per_token(seconds: list[float]) -> float:
    """Time per token of a layer taking `seconds` per call at each of ROWS rows."""
    return sum(t / rows for t, rows in zip(seconds, ROWS))


def _overridden(value: str, shapes: list[Shape]) -> dict[Shape, str]:
    if value not in BACKENDS:
        raise ValueError(f"{ENV_VAR}={value!r} is not a linear backend; choose one of {', '.join(BACKENDS)}.")
    if value not in present():
        raise ValueError(f"{ENV_VAR}={value!r} cannot run on this machine "
                         f"({'no C compiler built the panel kernel' if value == 'panels' else 'no oneDNN'}).")
    choices = {shape: value if value in available(shape) else "torch" for shape in shapes}
    misfits = [shape for shape, choice in choices.items() if choice != value]
    if misfits:
        logger.warning("%s=%s: weights of shapes %s are not whole panels and run on torch.", ENV_VAR, value, misfits)
    return choices


def _cache_key(shapes: list[Shape]) -> str:
    parts = [cpu_kernels.cpu_signature(), torch.__version__, str(torch.get_num_threads()),
             cpu_kernels.sources_digest(), repr(shapes)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _read_choices(path: str, shapes: list[Shape]) -> Optional[dict[Shape, str]]:
    """The cached choices, or None where there are none or they do not fit (a stale or damaged file)."""
    try:
        with open(path) as f:
            layers = json.load(f)["layers"]
        choices = {shape: layers[f"{shape[0]}x{shape[1]}"]["backend"] for shape in shapes}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return choices if all(choices[shape] in available(shape) for shape in shapes) else None


def _write_choices(path: str, choices: dict[Shape, str], timings: dict[Shape, dict[str, list[float]]]) -> None:
    """The choices with the timings behind them (ms per call at each of ROWS), written atomically: processes
    starting at once never read half a file."""
    layers = {f"{out}x{k}": {"backend": choices[(out, k)],
                             "ms_per_call": {name: [round(t * 1e3, 4) for t in seconds]
                                             for name, seconds in timings[(out, k)].items()}}
              for out, k in choices}
    record = {"cpu": cpu_kernels.cpu_model_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "rows": list(ROWS), "layers": layers}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(partial, path)
