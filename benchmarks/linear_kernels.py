"""The float32 linear layers of the default model on each kernel, against the machine's limits, in one
invocation: the panel kernel (csrc/packed_linear.c, the batch-invariant default) and PyTorch's F.linear (MKL).

    python benchmarks/linear_kernels.py
    python benchmarks/linear_kernels.py --baseline HEAD~1 --repeats 60   # and HEAD~1's panel kernel at decode

At 1 and 8 rows (decode) a step's linears (30 layers of four weights, then the LM head) read every weight
from memory: the figure is their time against a timed streaming read of the same bytes (the latency
benchmark's TPOT limit). At 128 and 2048 rows (prefill) they compute: the figure is GFLOP/s against the
matmul rate the latency benchmark measures (machine_limits.py). Kernels, row counts and repeats take turns,
and each keeps its least time, so other work on the machine stretches the figures less; the streaming read
takes its turn with them, so its best is measured in the same conditions. `--baseline REV` also times the
panel kernel of a git revision at the decode row counts (built with the engine's flags), and the JSON gives
this checkout's time over it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.common import machine_info, write_result  # noqa: E402
from benchmarks.kernel_revisions import build, revision_sources  # noqa: E402
from benchmarks.machine_limits import cpu_flags, matmul_rate  # noqa: E402
from pagedllm.model import cpu_kernels  # noqa: E402

HIDDEN, INTERMEDIATE, KV_WIDTH, LAYERS, VOCAB = 576, 1536, 192, 30, 49152  # SmolLM2-135M
LAYER_SHAPES = [(HIDDEN + 2 * KV_WIDTH, HIDDEN), (HIDDEN, HIDDEN), (2 * INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)]
DECODE_ROWS = (1, 8)
PREFILL_ROWS = (128, 2048)


def _step(kernel: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], weights: list[torch.Tensor],
          inputs: dict[int, torch.Tensor]) -> Callable[[], None]:
    """A decode step's linears in order: each layer's four weights, then the LM head."""
    def run() -> None:
        for weight, (_, k) in zip(weights, LAYER_SHAPES * LAYERS + [(VOCAB, HIDDEN)]):
            kernel(inputs[k], weight)
    return run


def _least(calls: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """The least seconds of each call over `repeats` rounds in which they take turns."""
    best = {name: float("inf") for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also time this git revision's panel kernel at decode")
    parser.add_argument("--output", default=None,
                        help="JSON file (default: benchmarks/results/linear_kernels-<time>.json)")
    args = parser.parse_args(argv)
    panels = cpu_kernels.load_packed_linear()
    if panels is None:
        raise SystemExit("No C compiler built the panel kernel.")
    torch.manual_seed(0)
    dense = [torch.randn(out, k) * 0.02 for out, k in LAYER_SHAPES * LAYERS + [(VOCAB, HIDDEN)]]
    packed = [panels.pack(w) for w in dense]
    weight_bytes = sum(w.numel() * 4 for w in dense)
    machine = {**machine_info(), "cpu_flags": cpu_flags(), "threads": torch.get_num_threads()}
    result: dict[str, Any] = {"machine": machine, "panel_width": panels.panel, "weight_bytes": weight_bytes,
                              "baseline": args.baseline}
    kernels = {"panels": panels.float32, "mkl": torch.nn.functional.linear}
    if args.baseline:
        baseline = cpu_kernels.packed_linear(build(revision_sources(args.baseline), "packed_linear.c"))
        kernels[f"panels@{args.baseline}"] = baseline.float32
    with torch.inference_mode():
        buffer = torch.ones(weight_bytes // 4)  # streamed (summed) in turn with the steps: the same conditions
        buffer.sum()
        stream = 0.0
        for rows in DECODE_ROWS:
            inputs = {k: torch.randn(rows, k) for k in (HIDDEN, INTERMEDIATE)}
            times = _least({**{name: _step(kernel, dense if name == "mkl" else packed, inputs)
                               for name, kernel in kernels.items()}, "stream": buffer.sum}, args.repeats)
            stream = max(stream, weight_bytes / times.pop("stream"))
            result[f"decode_{rows}_rows_ms"] = {name: round(t * 1e3, 2) for name, t in times.items()}
        limit = weight_bytes / stream
        result["stream_bytes_per_s"] = round(stream)
        for rows in DECODE_ROWS:
            times = result[f"decode_{rows}_rows_ms"]
            result[f"decode_{rows}_rows_vs_stream_limit"] = {name: round(t / 1e3 / limit, 3)
                                                             for name, t in times.items()}
            if args.baseline:
                result[f"decode_{rows}_rows_vs_baseline"] = round(times["panels"] / times[f"panels@{args.baseline}"], 3)
            against = f"; this checkout {result[f'decode_{rows}_rows_vs_baseline']:.3f}x the baseline's time" \
                if args.baseline else ""
            print(f"{rows} row(s): one step's linears " + ", ".join(
                f"{name} {t:.1f} ms = {t / 1e3 / limit:.2f}x" for name, t in times.items())
                + f" the streaming limit {limit * 1e3:.1f} ms ({stream / 1e9:.1f} GB/s){against}", flush=True)
        rate = max(matmul_rate() for _ in range(2))
        result["matmul_flops_per_s"] = round(rate)
        for rows in PREFILL_ROWS:
            flops = {f"{out}x{k}": 2 * rows * out * k for out, k in LAYER_SHAPES}
            x = {k: torch.randn(rows, k) for k in (HIDDEN, INTERMEDIATE)}
            calls: dict[str, Callable[[], Any]] = {}
            for (out, k), weight, packed_weight in zip(LAYER_SHAPES, dense, packed):
                calls[f"panels {out}x{k}"] = lambda k=k, w=packed_weight: panels.float32(x[k], w)
                calls[f"mkl {out}x{k}"] = lambda k=k, w=weight: torch.nn.functional.linear(x[k], w)
            times = _least(calls, max(2, args.repeats // (4 if rows > 256 else 1)))
            gflops = {name: round(flops[name.split()[1]] / t / 1e9, 1) for name, t in times.items()}
            result[f"prefill_{rows}_rows_gflops"] = gflops
            print(f"{rows} rows, GFLOP/s (matmul rate {rate / 1e9:.0f}): "
                  + ", ".join(f"{name} {g:.0f}" for name, g in gflops.items()), flush=True)
    print(f"wrote {write_result(result, args.output, 'linear_kernels')}")
    return result


if __name__ == "__main__":
    main()
