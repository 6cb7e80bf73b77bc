"""The default model's 4-bit block layers (GGUF Q4_1) on the panel kernel's two products, in one invocation:
float32 products (dtype float32: the blocks decoded to their float32 weights) and bfloat16 inputs (dtype
bfloat16 on a CPU with AVX512_BF16: the input rounded to bfloat16, AVX512_BF16's dot products).

    python benchmarks/block_kernels.py
    python benchmarks/block_kernels.py --rows 1,4,8,64,256 --repeats 10
    python benchmarks/block_kernels.py --baseline HEAD~1   # and HEAD~1's block kernel, built beside this one

For each row count, one decode step's layers (30 layers of four weights, 66 MB of blocks, each weight streamed
from memory in turn) with each product, replayed as a CPU graph replays them (plan.c, no Python between the
calls), taking turns with a streaming read of the same bytes, each keeping its least time; the figures are
bfloat16's time over float32's and each one's time over the streaming read's. Where the CPU has no AVX512_BF16,
float32 products alone. `--baseline REV` also times that git revision's block kernel (float32 products), built
with the same flags, and gives this checkout's time over it.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

from benchmarks.common import machine_info, write_result  # noqa: E402
from benchmarks.kernel_revisions import build, revision_sources  # noqa: E402
from benchmarks.linear_kernels import LAYER_SHAPES, LAYERS, _least  # noqa: E402
from benchmarks.machine_limits import cpu_flags  # noqa: E402
from pagedllm.model import cpu_kernels  # noqa: E402
from pagedllm.model.weight_blocks import pack_blocks  # noqa: E402


def _q4_weight(out: int, k: int, seed: int) -> torch.Tensor:
    """A random weight through GGUF's Q4_1 and back, as the loader reads one."""
    dense = np.random.default_rng(seed).standard_normal((out, k), dtype=np.float32) * 0.02
    q4_1 = GGMLQuantizationType.Q4_1
    return torch.from_numpy(np.array(dequantize(quantize(dense, q4_1), q4_1), dtype=np.float32))


def _step(kernel: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], weights: list[torch.Tensor],
          inputs: dict[int, torch.Tensor]) -> Callable[[], None]:
    """A decode step's layers in order, each weight once, recorded once and replayed by plan.c."""
    with cpu_kernels.recording_calls() as calls:
        outputs = [kernel(inputs[k], weight) for weight, (_, k) in zip(weights, LAYER_SHAPES * LAYERS)]
    run_plan = cpu_kernels.load_plan_runner()
    entries = (ctypes.c_void_p * len(calls))(*(call.entry for call in calls))
    arguments = (ctypes.c_void_p * len(calls))(*(ctypes.addressof(call.words) for call in calls))

    def run() -> None:
        run_plan(entries, arguments, len(calls))

    run.recorded = (calls, outputs)  # the plan points into their arguments and tensors: they live as long as it
    return run


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,4,8,64,256", help="row counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--baseline", default=None, metavar="REV", help="also time this git revision's block kernel")
    parser.add_argument("--output", default=None, help="JSON file (default: benchmarks/results/block_kernels-<time>.json)")
    args = parser.parse_args(argv)
    kernels = cpu_kernels.load_packed_linear()
    if kernels is None or kernels.blocks is None:
        raise SystemExit("This CPU's build of the panel kernel has no block products (they need AVX2, F16C).")
    dense = [_q4_weight(out, k, seed) for seed, (out, k) in enumerate(LAYER_SHAPES * LAYERS)]
    float32 = [pack_blocks(w, kernels.panel) for w in dense]
    products = {"float32": (kernels.blocks, float32)}
    if kernels.blocks_bf16 is not None:
        products["bfloat16"] = (kernels.blocks_bf16,
                                [pack_blocks(w, kernels.panel, bfloat16_inputs=True) for w in dense])
    if args.baseline:
        baseline = cpu_kernels.packed_linear(build(revision_sources(args.baseline), "packed_linear.c"))
        if baseline.blocks is None:
            raise SystemExit(f"--baseline {args.baseline}: that revision's panel kernel has no block products.")
        products[f"float32@{args.baseline}"] = (baseline.blocks, float32)
    weight_bytes = sum(w.numel() for w in float32)
    result: dict[str, Any] = {"machine": {**machine_info(), "cpu_flags": cpu_flags(),
                                          "threads": torch.get_num_threads()}, "weight_bytes": weight_bytes,
                              "baseline": args.baseline}
    with torch.inference_mode():
        buffer = torch.ones(weight_bytes // 4)  # streamed (summed) in turn with the steps: the same conditions
        for rows in (int(r) for r in args.rows.split(",")):
            inputs = {k: torch.randn(rows, k) for _, k in LAYER_SHAPES}
            steps = {name: _step(kernel, weights, inputs) for name, (kernel, weights) in products.items()}
            times = _least({**steps, "stream": buffer.sum}, args.repeats)
            stream = times.pop("stream")
            row = result[f"{rows}_rows"] = {"ms": {name: round(t * 1e3, 3) for name, t in times.items()},
                                            "vs_stream": {name: round(t / stream, 3) for name, t in times.items()},
                                            "stream_bytes_per_s": round(weight_bytes / stream)}
            line = (f"{rows} row(s): float32 products {times['float32'] * 1e3:.2f} ms "
                    f"({times['float32'] / stream:.2f}x the read)")
            if "bfloat16" in times:
                row["bfloat16_vs_float32"] = round(times["bfloat16"] / times["float32"], 3)
                line += f"; bfloat16 inputs {times['bfloat16'] * 1e3:.2f} ms = {row['bfloat16_vs_float32']:.2f}x"
            if args.baseline:
                row["float32_vs_baseline"] = round(times["float32"] / times[f"float32@{args.baseline}"], 3)
                line += f"; {row['float32_vs_baseline']:.3f}x {args.baseline}'s time"
            print(f"{line}; the streaming read {stream * 1e3:.2f} ms ({weight_bytes / stream / 1e9:.1f} GB/s)",
                  flush=True)
    print(f"wrote {write_result(result, args.output, 'block_kernels')}")
    return result


if __name__ == "__main__":
    main()
