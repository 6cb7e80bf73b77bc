"""Where the time to first token of the `latency` workload goes: each C kernel call of a prompt's prefill (the
linear layers by shape, attention, the element-wise steps, the LM head on the last token) and the Python between
them, against the prefill compute limit that benchmarks/latency.py uses.

    python benchmarks/prefill_profile.py            # --prompts 20

Each prompt of the workload (no prefix cache can help) runs with max_tokens=1, after two warm-up prompts.
Every prompt makes the same calls in the same order, so each call, and each gap between two calls, is timed at
its place in the step and keeps its least time over the prompts: on a machine busy with other work the sum of
these minima estimates the quiet machine's time better than any one prompt does, and the parts still add up.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (default_model_flops, load_workload, machine_info, token_prompts,  # noqa: E402
                               write_result)
from benchmarks.machine_limits import cpu_flags, matmul_rate  # noqa: E402

WARMUP = 2


def _timed_calls(engine: Any, prompts: list[list[int]]) -> list[tuple[list[str], list[float], list[float]]]:
    """For each prompt: the names of the kernel calls of its step, their seconds, and the seconds before each
    call and after the last (Python, the scheduler and sampling included)."""
    from pagedllm import SamplingParams, TokensPrompt
    from pagedllm.model import cpu_kernels

    events: list[tuple[str, float, float]] = []
    call = cpu_kernels.Kernel.__call__

    def timed(kernel: cpu_kernels.Kernel, *args: Any) -> None:
        name = kernel.entry.__name__.removesuffix("_entry")
        if name.startswith("packed_linear"):  # (..., rows, out, in)
            name = f"linear {args[-2]}x{args[-1]}, {args[-3]} rows"
        start = time.perf_counter()
        call(kernel, *args)
        events.append((name, start, time.perf_counter()))

    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    runs = []
    cpu_kernels.Kernel.__call__ = timed
    try:
        for i, prompt in enumerate(prompts):
            events.clear()
            start = time.perf_counter()
            engine.add_request(f"profile-{i}", TokensPrompt(prompt_token_ids=prompt), params)
            while engine.has_unfinished_requests():
                engine.step()
            end = time.perf_counter()
            marks = [start] + [t for _, begin, finish in events for t in (begin, finish)] + [end]
            runs.append(([name for name, _, _ in events], [f - b for _, b, f in events],
                         [marks[j + 1] - marks[j] for j in range(0, len(marks), 2)]))
    finally:
        cpu_kernels.Kernel.__call__ = call
    return runs[WARMUP:]


def profile(prompts: list[list[int]]) -> dict[str, Any]:
    from pagedllm import LLM

    runs = _timed_calls(LLM().llm_engine, prompts)
    names = runs[0][0]
    if any(run[0] != names for run in runs):
        raise RuntimeError("The prompts' steps made different kernel calls; their times cannot be matched.")
    calls = [min(run[1][j] for run in runs) for j in range(len(names))]
    gaps = [min(run[2][j] for run in runs) for j in range(len(names) + 1)]
    parts: dict[str, float] = collections.defaultdict(float)
    for name, seconds in zip(names, calls):
        parts[name] += seconds
    parts["Python and the engine between calls"] = sum(gaps)
    return {"ms": {name: round(s * 1e3, 2) for name, s in sorted(parts.items(), key=lambda item: -item[1])},
            "calls": dict(collections.Counter(names)), "ttft_least_ms": round(min(sum(r[1]) + sum(r[2])
                                                                                   for r in runs) * 1e3, 1)}


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=20, help="prompts timed (after two warm-up prompts)")
    parser.add_argument("--output", default=None,
                        help="JSON file (default: benchmarks/results/prefill_profile-<time>.json)")
    args = parser.parse_args(argv)
    import torch

    workload = load_workload("latency")
    result = profile(token_prompts(workload, args.prompts + WARMUP))
    rate = max(matmul_rate() for _ in range(2))
    limit_ms = default_model_flops(workload["input_len"], 1) / rate * 1e3
    total = sum(result["ms"].values())
    print(f"{workload['input_len']}-token prefill on {torch.get_num_threads()} threads, least time of each part over "
          f"{args.prompts} prompts: {total:.1f} ms = {total / limit_ms:.2f}x the compute limit {limit_ms:.0f} ms "
          f"({rate / 1e9:.0f} GFLOP/s); least whole TTFT {result['ttft_least_ms']} ms")
    for name, ms in result["ms"].items():
        print(f"  {name:40s} {ms:8.2f} ms  {ms / total:6.1%}  ({result['calls'].get(name, '-')} calls)")
    result.update({"workload": "latency", "prompts": args.prompts, "sum_of_least_ms": round(total, 1),
                   "matmul_flops_per_s": round(rate), "compute_limit_ms": round(limit_ms, 1),
                   "sum_vs_compute_limit": round(total / limit_ms, 3),
                   "machine": {**machine_info(), "cpu_flags": cpu_flags(), "threads": torch.get_num_threads()}})
    print(f"wrote {write_result(result, args.output, 'prefill_profile')}")
    return result


if __name__ == "__main__":
    main()
