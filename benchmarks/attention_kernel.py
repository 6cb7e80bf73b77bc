"""The decode attention kernel (csrc/paged_attention.c) alone, at the `throughput` workload's batch sizes and
contexts, as a rate of KV cache read, optionally against the kernel of another git revision in one invocation.

    python benchmarks/attention_kernel.py                       # this checkout's kernel
    python benchmarks/attention_kernel.py --baseline HEAD~1     # and HEAD~1's, taking turns; prints the ratio

A step is the kernel over the 30 layers of the default model (each with its own cache, so that, as in the
engine, the keys and values come from memory and not from a cache warmed by the previous call), every
sequence at the workload's mean decode context, its blocks scattered over the pool as after a while of
serving. Kernels, batch sizes and repeats take turns and each keeps its least time, so that other work on the
machine stretches the figures less.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.common import load_workload, machine_info, write_result  # noqa: E402
from benchmarks.kernel_revisions import build, checkout_sources, revision_sources  # noqa: E402
from pagedllm.model import cpu_kernels  # noqa: E402

KV_HEADS, GROUP, HEAD_DIM, LAYERS = 3, 3, 64, 30  # SmolLM2-135M

Step = Callable[[], None]


def build_kernel(sources: dict[str, bytes], block_size: int) -> cpu_kernels.Kernel:
    """The attention kernel of these sources, built with the engine's flags."""
    library = build(sources, "paged_attention.c", (f"GROUP={GROUP}", f"HEAD_DIM={HEAD_DIM}", f"BLOCK_SIZE={block_size}"))
    return cpu_kernels.Kernel(library, "paged_attention_rows")


def make_step(kernel: cpu_kernels.Kernel, caches: list[tuple[torch.Tensor, torch.Tensor]], q: torch.Tensor,
              out: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor) -> Step:
    """The kernel over every layer's cache for one decode batch."""
    def run() -> None:
        for k_cache, v_cache in caches:
            kernel(q, k_cache, v_cache, out, tables, None, lens, q.shape[0], q.stride(0), KV_HEADS,
                   k_cache.shape[1], tables.shape[1], HEAD_DIM ** -0.5)
    return run


def least_times(steps: dict[str, Step], repeats: int) -> dict[str, tuple[float, float]]:
    """Each step's least wall time and least CPU time of this process (which other work on the machine
    stretches less, though it counts the threads' waits) over `repeats` rounds in which they take turns."""
    best = {name: (float("inf"), float("inf")) for name in steps}
    order = list(steps.items())
    for _ in range(repeats):
        order.reverse()  # each step runs first in half the rounds: whichever runs first meets colder caches
        for name, step in order:
            start, cpu_start = time.perf_counter(), time.process_time()
            step()
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    return best


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", default="16,32,64")
    parser.add_argument("--context", type=int, default=None,
                        help="tokens each sequence attends to (default: the workload's mean decode context)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--baseline", default=None, metavar="REV", help="also time this git revision's kernel")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="OpenMP threads (default: PyTorch's)")
    parser.add_argument("--output", default=None, help="JSON file (default: benchmarks/results/attention_kernel-<time>.json)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    workload = load_workload("throughput")
    context = args.context or workload["input_len"] + workload["output_len"] // 2
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    kernels = {"current": build_kernel(checkout_sources(), args.block_size)}
    if args.baseline:
        kernels["baseline"] = build_kernel(revision_sources(args.baseline), args.block_size)

    blocks_per_seq = -(-context // args.block_size)
    num_blocks = max(sizes) * blocks_per_seq
    generator = torch.Generator().manual_seed(0)
    caches = [tuple(torch.randn(KV_HEADS, num_blocks, args.block_size, HEAD_DIM, generator=generator)
                    for _ in range(2)) for _ in range(LAYERS)]
    steps, outputs, kv_bytes = {}, {}, {}
    for size in sizes:
        tables = torch.randperm(num_blocks, generator=generator)[:size * blocks_per_seq].view(size, blocks_per_seq)
        lens = torch.full((size,), context, dtype=torch.long)
        # q is a view of the merged QKV projection, as in the engine.
        qkv = torch.randn(size, (KV_HEADS * GROUP + 2 * KV_HEADS), HEAD_DIM, generator=generator)
        q = qkv[:, :KV_HEADS * GROUP]
        kv_bytes[size] = LAYERS * 2 * size * context * KV_HEADS * HEAD_DIM * 4
        for name, kernel in kernels.items():
            outputs[name, size] = torch.empty(size, KV_HEADS * GROUP, HEAD_DIM)
            steps[f"{name}/{size}"] = make_step(kernel, caches, q, outputs[name, size], tables, lens)
    best = least_times(steps, args.repeats)
    rows = []
    for size in sizes:
        row: dict[str, Any] = {"sequences": size, "context": context}
        for name in kernels:
            wall, cpu = best[f"{name}/{size}"]
            row[name] = {"step_ms": round(1000 * wall, 3), "cpu_ms": round(1000 * cpu, 3),
                         "kv_gb_per_s": round(kv_bytes[size] / wall / 1e9, 1)}
        if "baseline" in kernels:
            row["speedup"] = round(best[f"baseline/{size}"][0] / best[f"current/{size}"][0], 3)
            row["cpu_time_ratio"] = round(best[f"baseline/{size}"][1] / best[f"current/{size}"][1], 3)
            row["max_abs_diff"] = float((outputs["current", size] - outputs["baseline", size]).abs().max())
        print(row, flush=True)
        rows.append(row)
    result = {"block_size": args.block_size, "layers": LAYERS, "threads": torch.get_num_threads(),
              "baseline": args.baseline, "machine": machine_info(), "by_batch_size": rows}
    print(f"wrote {write_result(result, args.output, 'attention_kernel')}")
    return result


if __name__ == "__main__":
    main()
