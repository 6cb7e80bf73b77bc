"""What stats logging costs: the `throughput` workload with stats off and on, in one invocation.

One engine on the default model, built with the logging and Prometheus stat loggers, runs the workload
alternately with stats off and on (off, on, off, on, ...); "off" sets the two flags that
`disable_log_stats=True` sets, so one model copy serves both modes and their runs interleave. The row
reports each mode's best output tokens/s, their ratio, and the share of the stats-on runs spent in stats
code (timed around the engine's stats calls), which does not depend on how busy the machine is.
Prints one JSON row.

    python benchmarks/stats_overhead.py [--workloads-file PATH] [--rounds 2] [--output PATH]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import load_workload, machine_info, peak_rss_mib, token_prompts, write_result  # noqa: E402
from pagedllm import LLM, SamplingParams  # noqa: E402


class _Timer:
    """Wraps callables so that the seconds spent inside them add up in `seconds`."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return timed


def _time_stats_calls(llm: LLM) -> _Timer:
    timer = _Timer()
    engine = llm.llm_engine
    engine.do_log_stats = timer.wrap(engine.do_log_stats)
    for name in ("on_schedule", "on_tokens", "on_finished"):
        setattr(engine.stats, name, timer.wrap(getattr(engine.stats, name)))
    return timer


def _set_stats(llm: LLM, on: bool) -> None:
    """What `disable_log_stats` decides: whether stats are gathered and handed to the stat loggers."""
    llm.llm_engine.log_stats = llm.llm_engine.stats.collect = on


def _run(llm: LLM, prompts: list[dict], params: SamplingParams) -> tuple[float, int]:
    llm.reset_prefix_cache()  # every run computes its prompts: repeats must not hit the previous run's blocks
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads-file", default=None, help="workloads.json (default: ../shared/bench)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default=None)
    parser.add_argument("--output", default=None, help="JSON file (default: benchmarks/results/stats_overhead-<time>.json)")
    args = parser.parse_args()
    workload = load_workload("throughput", args.workloads_file)
    prompts = [{"prompt_token_ids": ids} for ids in token_prompts(workload, workload["num_prompts"])]
    params = SamplingParams(temperature=workload["temperature"], max_tokens=workload["output_len"],
                            ignore_eos=True)
    llm = LLM(args.model, kv_cache_memory=1 << 30, disable_log_stats=False)
    timer = _time_stats_calls(llm)
    best = {"off": float("inf"), "on": float("inf")}
    on_seconds = stats_seconds = 0.0
    output_tokens = 0
    for _ in range(args.rounds):
        for mode in ("off", "on"):
            _set_stats(llm, mode == "on")
            timer.seconds = 0.0
            elapsed, output_tokens = _run(llm, prompts, params)
            print(f"stats {mode}: {output_tokens / elapsed:.1f} output tokens/s", file=sys.stderr, flush=True)
            best[mode] = min(best[mode], elapsed)
            if mode == "on":
                on_seconds += elapsed
                stats_seconds += timer.seconds
    off_tps, on_tps = output_tokens / best["off"], output_tokens / best["on"]
    row = {
        "benchmark": "stats_overhead", "workload": "throughput", "num_prompts": workload["num_prompts"],
        "input_len": workload["input_len"], "output_len": workload["output_len"], "rounds": args.rounds,
        "off_output_tokens_per_s": round(off_tps, 2), "on_output_tokens_per_s": round(on_tps, 2),
        "on_over_off": round(on_tps / off_tps, 4), "overhead_pct": round(100 * (1 - on_tps / off_tps), 2),
        "stats_time_share_pct": round(100 * stats_seconds / on_seconds, 3), "machine": machine_info(),
        "peak_rss_mib": round(peak_rss_mib(), 1),
    }
    print(json.dumps(row))
    print(f"wrote {write_result(row, args.output, 'stats_overhead')}")


if __name__ == "__main__":
    main()
