"""Which kernel runs each float32 linear layer on this CPU: chosen by timing the candidates, not by vendor.

The fastest kernel depends on the CPU model more than on its maker: on an Intel Xeon (AVX-512) the panel
kernel (csrc/packed_linear.c) beat MKL 1.3-1.7x at 8 to 64 rows, and on an AMD Zen 4 it decoded at 21.2 ms
per token against 39.5 for oneDNN, which had been chosen there because the machine was AMD. So on the first
start on a CPU the candidates are timed on the model's own layer shapes (about a second) and the choice is
cached on disk beside the compiled kernels, keyed by the CPU's model and flags, the torch version, the
thread count, the kernel sources and the shapes. `PAGEDLLM_LINEAR_BACKEND=panels|onednn|torch` overrides it.

The candidates and their timing are in linear_timing.py. A layer keeps one layout, so each shape gets the
candidate with the least time per token summed over three regimes: decode of one sequence (all of a call's
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
    """The backend each float32 weight shape runs on: PAGEDLLM_LINEAR_BACKEND where set, else the cached
    measurement for this CPU and these shapes, measured now if there is none."""
    shapes = sorted(set(shapes))
    if not shapes:
        return {}
    override = os.environ.get(ENV_VAR)
    if override:
        return _overridden(override, shapes)
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
