"""Latency of one request at a time: time to first token (TTFT) and mean time per output token (TPOT).

    python benchmarks/latency.py            # pagedllm and transformers at batch 1
    python benchmarks/latency.py --no-hf    # pagedllm only

Each repeat runs its own prompt of the `latency` workload (so no prefix cache can help), after one
warm-up request; the median over repeats is reported, with the transformers batch-1 figures of the same
invocation and their ratios.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (add_engine_args, default_model_flops, load_hf_model, load_workload,  # noqa: E402
                               machine_info, parse_engine_args,
                               run_in_child, token_prompts, write_result)

TARGET_TPOT_S = 0.020
TARGET_TTFT_S = 0.17


def run_pagedllm(prompts: list[list[int]], output_len: int, engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    from pagedllm import LLM, SamplingParams, TokensPrompt

    start = time.perf_counter()
    engine = LLM(**engine_kwargs).llm_engine
    startup_s = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    runs = []
    for i, prompt in enumerate(prompts):
        start = time.perf_counter()
        engine.add_request(f"latency-{i}", TokensPrompt(prompt_token_ids=prompt), params)
        first = end = None
        while engine.has_unfinished_requests():
            for output in engine.step():
                if first is None and output.outputs[0].token_ids:
                    first = time.perf_counter()
                if output.finished:
                    end = time.perf_counter()
                    num_tokens = len(output.outputs[0].token_ids)
        runs.append(_run(start, first, end, num_tokens, output_len))
    return {**_summary(runs[1:]), "startup_s": round(startup_s, 2), "engine_args": engine_kwargs}


def run_transformers(prompts: list[list[int]], output_len: int) -> dict[str, Any]:
    import torch
    from transformers.generation.streamers import BaseStreamer

    class Clock(BaseStreamer):
        """Records when each generated token arrives (the first put() is the prompt)."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self.puts = 0

        def put(self, value: Any) -> None:
            self.puts += 1
            if self.puts > 1:
                self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    model = load_hf_model()
    runs = []
    with torch.inference_mode():
        for prompt in prompts:
            clock = Clock()
            input_ids = torch.tensor([prompt])
            start = time.perf_counter()
            out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                                 max_new_tokens=output_len, min_new_tokens=output_len, pad_token_id=0,
                                 streamer=clock)
            end = time.perf_counter()
            runs.append(_run(start, clock.times[0], end, out.shape[1] - input_ids.shape[1], output_len))
    return _summary(runs[1:])


def _run(start: float, first: Optional[float], end: Optional[float], num_tokens: int,
         output_len: int) -> dict[str, float]:
    if first is None or end is None or num_tokens != output_len:
        raise RuntimeError(f"Expected exactly {output_len} output tokens, got {num_tokens}.")
    return {"ttft_s": first - start, "tpot_s": (end - first) / (output_len - 1), "e2e_s": end - start}


def _summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    """Median of each figure over the repeats (the warm-up run is left out by the caller)."""
    return {key: round(statistics.median(r[key] for r in runs), 4) for key in runs[0]} | {
        "repeats": [{k: round(v, 4) for k, v in r.items()} for r in runs]}


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads-file", default=None, help="workloads.json (default: ../shared/bench)")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    add_engine_args(parser)
    parser.add_argument("--peak-gflops", type=float, default=190.0,
                        help="the machine's float32 matmul rate used for the prefill compute limit")
    parser.add_argument("--output", default=None, help="JSON file (default: benchmarks/results/latency-<time>.json)")
    args = parser.parse_args(argv)

    workload = load_workload("latency", args.workloads_file)
    # One extra prompt first: the warm-up run.
    prompts = token_prompts(workload, workload["repeats"] + 1)
    output_len = workload["output_len"]
    prefill_limit = default_model_flops(workload["input_len"], 1) / (args.peak_gflops * 1e9)
    ours = run_in_child(run_pagedllm, prompts, output_len, parse_engine_args(args))
    print(f"pagedllm: TTFT {ours['ttft_s'] * 1e3:.0f} ms (target {TARGET_TTFT_S * 1e3:.0f}, compute limit "
          f"{prefill_limit * 1e3:.0f}), TPOT {ours['tpot_s'] * 1e3:.1f} ms (target {TARGET_TPOT_S * 1e3:.0f}), "
          f"start {ours['startup_s']:.1f} s, peak RSS {ours['peak_rss_mib']:.0f} MiB", flush=True)
    result: dict[str, Any] = {"workload": "latency", "definition": workload, "machine": machine_info(),
                              "prefill_compute_limit_s": round(prefill_limit, 4),
                              "targets": {"ttft_s": TARGET_TTFT_S, "tpot_s": TARGET_TPOT_S}, "pagedllm": ours}
    if not args.no_hf:
        theirs = run_in_child(run_transformers, prompts, output_len)
        print(f"transformers (batch 1): TTFT {theirs['ttft_s'] * 1e3:.0f} ms, TPOT {theirs['tpot_s'] * 1e3:.1f} ms, "
              f"peak RSS {theirs['peak_rss_mib']:.0f} MiB", flush=True)
        result["transformers"] = theirs
        result["speedup_vs_transformers"] = {"ttft": round(theirs["ttft_s"] / ours["ttft_s"], 3),
                                             "tpot": round(theirs["tpot_s"] / ours["tpot_s"], 3)}
        print(f"speed-up vs transformers: TTFT {result['speedup_vs_transformers']['ttft']:.2f}x, "
              f"TPOT {result['speedup_vs_transformers']['tpot']:.2f}x", flush=True)
    print(f"wrote {write_result(result, args.output, 'latency')}")
    return result


if __name__ == "__main__":
    main()
