"""The cost of guided decoding and of logprobs=20 against plain sampling, on the `throughput` workload.

Runs the workload three times in one process on one engine (plain, guided by a regex, logprobs=20) and
prints one JSON row: each run's time and output tokens/s, and each variant's time as a ratio to plain.
Usage: python benchmarks/sampling_cost.py [--workloads-file PATH] [--num-prompts N] [--output-len N]
[--device D] [--output PATH] (--num-prompts / --output-len shrink the workload for a quick look; the row
records what was run).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import load_workload, machine_info, peak_rss_mib, token_prompts, write_result  # noqa: E402
from pagedllm import LLM, SamplingParams  # noqa: E402
from pagedllm.sampling_params import GuidedDecodingParams  # noqa: E402

# Lower-case words and punctuation, never finished: a mask every step for the whole output.
GUIDE_REGEX = r"[a-z ,.]+"


def timed_run(llm: LLM, prompts: list, params: SamplingParams) -> dict[str, float]:
    llm.reset_prefix_cache()  # each variant computes its prompts: none reuses the previous variant's blocks
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"elapsed_s": round(elapsed, 3), "output_tokens": tokens, "output_tokens_per_s": round(tokens / elapsed, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads-file", default=None, help="workloads.json (default: ../shared/bench)")
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--output-len", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--output", default=None, help="JSON file (default: benchmarks/results/sampling_cost-<time>.json)")
    args = parser.parse_args()
    workload = load_workload("throughput", args.workloads_file)
    num_prompts = args.num_prompts or workload["num_prompts"]
    output_len = args.output_len or workload["output_len"]
    prompts = [{"prompt_token_ids": ids} for ids in token_prompts(workload, workload["num_prompts"])[:num_prompts]]
    llm = LLM(device=args.device)
    base = dict(temperature=workload["temperature"], max_tokens=output_len, ignore_eos=True)
    variants = {
        "plain": SamplingParams(**base),
        "guided_regex": SamplingParams(guided_decoding=GuidedDecodingParams(regex=GUIDE_REGEX), **base),
        "logprobs_20": SamplingParams(logprobs=20, **base),
    }
    for params in variants.values():  # warm-up: first-call costs (the grammar compiler, cache pages)
        llm.generate(prompts, dataclasses.replace(params, max_tokens=2), use_tqdm=False)
    results = {name: timed_run(llm, prompts, params) for name, params in variants.items()}
    plain = results["plain"]["elapsed_s"]
    row = {
        "benchmark": "sampling_cost", "workload": "throughput", "num_prompts": num_prompts,
        "input_len": workload["input_len"], "output_len": output_len, "device": args.device,
        "machine": machine_info(), "peak_rss_mib": round(peak_rss_mib(), 1), "runs": results,
        "time_ratio_vs_plain": {name: round(r["elapsed_s"] / plain, 3) for name, r in results.items()},
    }
    print(json.dumps(row))
    print(f"wrote {write_result(row, args.output, 'sampling_cost')}")


if __name__ == "__main__":
    main()
