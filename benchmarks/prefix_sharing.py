"""Prefix caching on vs off on the `prefix_sharing` workload, in one invocation.

    python benchmarks/prefix_sharing.py [--workloads-file PATH] [--output PATH] [--engine-arg KEY=VALUE ...]

Every request shares one long prefix and has its own suffix; all are submitted at once, greedy, each
generating exactly output_len tokens. The same requests run on an engine without and then, in a fresh
process, with prefix caching; the script prints both wall times, their ratio (the target is at least 3x),
the hit rate and whether the outputs are identical, and writes the figures as JSON.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (add_engine_args, load_workload, machine_info, parse_engine_args,  # noqa: E402
                               run_in_child, write_result)

TARGET_RATIO = 3.0


def make_prompts(workload: dict[str, Any]) -> list[list[int]]:
    """The shared prefix, then each request's own suffix, drawn from one generator in that order."""
    rng = np.random.default_rng(workload["seed"])
    low, high = workload["token_id_low"], workload["token_id_high"]
    prefix = rng.integers(low, high, size=workload["prefix_len"]).tolist()
    suffixes = rng.integers(low, high, size=(workload["num_prompts"], workload["suffix_len"])).tolist()
    return [prefix + suffix for suffix in suffixes]


def run(prompts: list[list[int]], output_len: int, engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    from pagedllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(**engine_kwargs)
    warmup = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=[11, 12, 13])], warmup, use_tqdm=False)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    stats = llm.llm_engine.scheduler.kv_cache.prefix_cache_stats
    return {"engine_args": engine_kwargs, "elapsed_s": round(elapsed, 3),
            "requests_per_s": round(len(prompts) / elapsed, 3),
            "output_tokens_per_s": round(len(prompts) * output_len / elapsed, 2),
            "num_cached_tokens": sum(o.num_cached_tokens or 0 for o in outputs),
            "prefix_cache_hit_rate": round(stats.hit_rate, 4),
            "output_token_ids": [list(o.outputs[0].token_ids) for o in outputs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads-file", default=None, help="workloads.json (default: ../shared/bench)")
    parser.add_argument("--output", default=None, help="JSON file (default: benchmarks/results/<name>-<time>.json)")
    add_engine_args(parser)
    args = parser.parse_args()
    workload = load_workload("prefix_sharing", args.workloads_file)
    prompts = make_prompts(workload)
    common = parse_engine_args(args)
    runs = {}
    for name, caching in (("off", False), ("on", True)):
        runs[name] = run_in_child(run, prompts, workload["output_len"], {**common, "enable_prefix_caching": caching})
        print(f"prefix caching {name}: {runs[name]['elapsed_s']:.1f} s, "
              f"{runs[name]['output_tokens_per_s']:.1f} output tok/s, "
              f"hit rate {runs[name]['prefix_cache_hit_rate']:.1%}", flush=True)
    ratio = runs["off"]["elapsed_s"] / runs["on"]["elapsed_s"]
    identical = runs["off"].pop("output_token_ids") == runs["on"].pop("output_token_ids")
    result = {"workload": "prefix_sharing", "definition": workload, "machine": machine_info(), "runs": runs,
              "speedup": round(ratio, 2), "target_speedup": TARGET_RATIO, "meets_target": ratio >= TARGET_RATIO,
              "outputs_identical": identical}
    path = write_result(result, args.output, "prefix_sharing")
    print(f"speedup with prefix caching: {ratio:.2f}x (target {TARGET_RATIO}x), outputs identical: {identical}; "
          f"wrote {path}")


if __name__ == "__main__":
    main()
