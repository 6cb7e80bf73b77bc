"""Offline throughput: pagedllm's LLM.generate against transformers.generate at its best batch size.

    python benchmarks/throughput.py                          # the `throughput` workload, both engines
    python benchmarks/throughput.py --workload throughput_large   # also runs `throughput`: the ratio is its target
    python benchmarks/throughput.py --no-hf                  # pagedllm only, for quick iteration
    python benchmarks/throughput.py --hf-batch-sizes 64      # limit the baseline's batch-size search
    python benchmarks/throughput.py --no-hf --engine-arg quantization=int8 --baseline-engine-arg quantization=null
                                                             # int8 against float32, both pagedllm
    python benchmarks/throughput.py --device cuda --hf-batch-sizes 64   # on a GPU (the default where there is one)
    python benchmarks/throughput.py --no-hf --vllm-python ~/vllm-cpu/bin/python
                                                             # against vLLM's CPU build (README: its setup)
    python benchmarks/throughput.py --num-scheduler-steps 8  # multi-step against single-step, interleaved

All requests are submitted at once as token-id prompts, greedy, each generating exactly output_len tokens.
Prints both engines' output tokens/s, their ratio, peak RSS and the fraction of the machine's compute
limit reached, and writes the figures as JSON.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (add_engine_args, benchmark_device, common_prefix_lengths, default_model_flops,  # noqa: E402
                               load_hf_model, load_workload, machine_info, parse_engine_args, parse_pairs,
                               run_in_child, token_prompts, write_result)
from benchmarks.machine_limits import measure_limits  # noqa: E402
from benchmarks.vllm_baseline import run_vllm  # noqa: E402

TARGET_RATIO = 1.6
TARGET_VLLM_RATIO = 1.3
TARGET_LARGE_RATIO = 1.0  # throughput_large against throughput


def run_pagedllm(prompts: list[list[int]], output_len: int, engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    from pagedllm import LLM, SamplingParams, TokensPrompt

    start = time.perf_counter()
    llm = LLM(**engine_kwargs)
    startup_s = time.perf_counter() - start
    warmup = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=prompts[0][:16])], warmup, use_tqdm=False)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    start, cpu_start = time.perf_counter(), time.process_time()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    elapsed, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    return {**_rates(len(prompts), len(prompts[0]), output_len, elapsed, tokens),
            "cpu_s": round(cpu_s, 2), "startup_s": round(startup_s, 2), "engine_args": engine_kwargs, "output_token_ids": tokens}


def run_transformers(prompts: list[list[int]], output_len: int, batch_sizes: list[int],
                     device: str = "cpu") -> dict[str, Any]:
    import torch

    model = load_hf_model(device)
    generate = _hf_generate(model, output_len)
    with torch.inference_mode():
        generate(torch.tensor([prompts[0][:16]], device=device), 4)
        by_batch = {}
        for batch_size in batch_sizes:
            start = time.perf_counter()
            tokens: list[list[int]] = []
            for i in range(0, len(prompts), batch_size):
                tokens.extend(generate(torch.tensor(prompts[i:i + batch_size], device=device), output_len))
            elapsed = time.perf_counter() - start
            by_batch[batch_size] = {**_rates(len(prompts), len(prompts[0]), output_len, elapsed, tokens),
                                    "output_token_ids": tokens}
            print(f"  transformers batch {batch_size}: {by_batch[batch_size]['output_tokens_per_s']:.1f} "
                  f"output tok/s", flush=True)
    best = max(by_batch, key=lambda b: by_batch[b]["output_tokens_per_s"])
    result = {**by_batch[best], "best_batch_size": best}
    result["by_batch_size"] = {b: {k: v for k, v in r.items() if k != "output_token_ids"}
                               for b, r in by_batch.items()}
    return result


def _hf_generate(model: Any, output_len: int) -> Any:
    import torch

    def generate(input_ids: torch.Tensor, new_tokens: int) -> list[list[int]]:
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
        return out[:, input_ids.shape[1]:].tolist()

    return generate


def _rates(num_requests: int, input_len: int, output_len: int, elapsed: float,
           tokens: list[list[int]]) -> dict[str, Any]:
    if len(tokens) != num_requests or any(len(t) != output_len for t in tokens):
        raise RuntimeError(f"Expected {num_requests} outputs of exactly {output_len} tokens.")
    output_tokens = num_requests * output_len
    return {"elapsed_s": round(elapsed, 3), "requests_per_s": round(num_requests / elapsed, 3),
            "output_tokens_per_s": round(output_tokens / elapsed, 2),
            "total_tokens_per_s": round((output_tokens + num_requests * input_len) / elapsed, 2)}


def _agreement(a: list[list[int]], b: list[list[int]]) -> dict[str, float]:
    """How far greedy outputs agree: identical requests, and the mean shared prefix."""
    same = sum(x == y for x, y in zip(a, b))
    prefix = common_prefix_lengths(a, b)
    return {"identical_requests": same / len(a), "mean_common_prefix_tokens": sum(prefix) / len(prefix)}


def _vllm_comparison(args: argparse.Namespace, prompts: list[list[int]], output_len: int,
                     ours: dict[str, Any]) -> dict[str, Any]:
    """vLLM on the same prompts, under its own interpreter, then pagedllm once more, and the ratio of pagedllm's
    mean rate over its runs before and after vLLM to vLLM's: a shared machine's speed drifts over the minutes
    vLLM takes to start and run, and runs on both sides of it share that drift alike."""
    child_env = dict(pair.split("=", 1) for pair in args.vllm_env)
    theirs = run_vllm(args.vllm_python, prompts, output_len, parse_pairs(args.vllm_engine_arg), child_env)
    tokens = theirs.pop("output_token_ids")
    theirs.update(_rates(len(prompts), len(prompts[0]), output_len, theirs.pop("elapsed_s"), tokens))
    print(f"vLLM {theirs['vllm_version']} ({theirs['env']}): {theirs['output_tokens_per_s']:.1f} output tok/s, "
          f"start {theirs['startup_s']:.1f} s", flush=True)
    after = run_in_child(run_pagedllm, prompts, output_len, parse_engine_args(args))
    after.pop("output_token_ids")
    mean = (ours["output_tokens_per_s"] + after["output_tokens_per_s"]) / 2
    ratio = mean / theirs["output_tokens_per_s"]
    print(f"pagedllm again after vLLM: {after['output_tokens_per_s']:.1f} output tok/s", flush=True)
    print(f"ratio pagedllm (mean of before and after, {mean:.1f}) / vLLM: {ratio:.2f}x (target {TARGET_VLLM_RATIO}x)",
          flush=True)
    return {"vllm": theirs, "pagedllm_after_vllm": after, "ratio_vs_vllm": round(ratio, 3),
            "ratio_vs_vllm_before_and_after": [round(run["output_tokens_per_s"] / theirs["output_tokens_per_s"], 3)
                                               for run in (ours, after)],
            "target_ratio_vs_vllm": TARGET_VLLM_RATIO,
            "agreement_with_vllm": _agreement(ours["output_token_ids"], tokens)}


def compare_multi_step(prompts: list[list[int]], output_len: int, engine_kwargs: dict[str, Any], steps: int,
                       repeats: int) -> dict[str, Any]:
    """pagedllm with num_scheduler_steps=steps and =1, alternating in fresh processes `repeats` times each; the
    best run of each counts (the machine may be shared), and the greedy outputs must agree."""
    runs: dict[int, list[dict[str, Any]]] = {steps: [], 1: []}
    for i in range(repeats):
        for n in (steps, 1) if i % 2 == 0 else (1, steps):
            run = run_in_child(run_pagedllm, prompts, output_len, {**engine_kwargs, "num_scheduler_steps": n})
            print(f"  num_scheduler_steps={n}: {run['output_tokens_per_s']:.1f} output tok/s", flush=True)
            runs[n].append(run)
    best = {n: max(r, key=lambda run: run["output_tokens_per_s"]) for n, r in runs.items()}
    agreement = _agreement(best[steps]["output_token_ids"], best[1]["output_token_ids"])
    ratio = best[steps]["output_tokens_per_s"] / best[1]["output_tokens_per_s"]
    # CPU seconds of the generating process: less swayed than wall time by other work on a shared machine.
    least_cpu = {n: min(run["cpu_s"] for run in rs) for n, rs in runs.items()}
    cpu_ratio = least_cpu[1] / least_cpu[steps]
    print(f"multi-step ({steps}) / single-step, best of {repeats}: {ratio:.3f}x in wall time, {cpu_ratio:.3f}x in "
          f"CPU time; identical outputs {agreement['identical_requests']:.0%}", flush=True)
    return {"num_scheduler_steps": steps, "repeats": repeats, "ratio_multi_vs_single_step": round(ratio, 3),
            "cpu_time_ratio_multi_vs_single_step": round(cpu_ratio, 3),
            "cpu_s": {str(n): [r["cpu_s"] for r in rs] for n, rs in runs.items()},
            "agreement": agreement,
            "output_tokens_per_s": {str(n): [r["output_tokens_per_s"] for r in rs] for n, rs in runs.items()},
            "best": {str(n): {k: v for k, v in run.items() if k != "output_token_ids"} for n, run in best.items()}}


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="throughput", choices=["throughput", "throughput_large"])
    parser.add_argument("--workloads-file", default=None, help="workloads.json (default: ../shared/bench)")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    parser.add_argument("--hf-batch-sizes", default="16,32,64",
                        help="comma-separated batch sizes tried for transformers; the best one counts")
    add_engine_args(parser)
    parser.add_argument("--baseline-engine-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="also run pagedllm with its engine args changed by these (repeatable; null unsets "
                             "one), as a second baseline in this invocation")
    parser.add_argument("--vllm-python", default=None, metavar="PATH",
                        help="an interpreter with vLLM's CPU build installed: also runs vLLM on the workload, "
                             "after pagedllm, and prints the ratio")
    parser.add_argument("--vllm-engine-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra keyword for vLLM's LLM (repeatable; dtype is float32 unless given)")
    parser.add_argument("--vllm-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for vLLM's process only, e.g. LD_PRELOAD (repeatable)")
    parser.add_argument("--peak-gflops", type=float, default=None,
                        help="the matmul rate used for the compute limit (default: measured now on the device, "
                             "float32 on CPU, bfloat16 on CUDA)")
    parser.add_argument("--num-scheduler-steps", type=int, default=None, metavar="N",
                        help="only compare pagedllm with num_scheduler_steps=N against 1, interleaved, best of "
                             "--repeats each, and print their ratio")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting with --num-scheduler-steps")
    parser.add_argument("--output", default=None, help="JSON file (default: benchmarks/results/<name>-<time>.json)")
    args = parser.parse_args(argv)

    workload = load_workload(args.workload, args.workloads_file)
    prompts = token_prompts(workload, workload["num_prompts"])
    output_len = workload["output_len"]
    peak_gflops = args.peak_gflops or (
        run_in_child(measure_limits, 4, benchmark_device(args))["matmul_flops_per_s"] / 1e9)
    limit = peak_gflops * 1e9 * output_len / default_model_flops(workload["input_len"], output_len)
    print(f"{args.workload}: {len(prompts)} requests x {workload['input_len']} in / {output_len} out; "
          f"compute limit {limit:.0f} output tok/s at {peak_gflops:.0f} GFLOP/s", flush=True)
    if args.num_scheduler_steps:
        result = {"workload": args.workload, "definition": workload, "machine": machine_info(),
                  **compare_multi_step(prompts, output_len, parse_engine_args(args), args.num_scheduler_steps,
                                       args.repeats)}
        print(f"wrote {write_result(result, args.output, args.workload + '_multi_step')}")
        return result

    ours = run_in_child(run_pagedllm, prompts, output_len, parse_engine_args(args))
    print(f"pagedllm: {ours['output_tokens_per_s']:.1f} output tok/s ({ours['elapsed_s']:.1f} s), "
          f"start {ours['startup_s']:.1f} s, peak RSS {ours['peak_rss_mib']:.0f} MiB, "
          f"{ours['output_tokens_per_s'] / limit:.0%} of the compute limit", flush=True)
    result: dict[str, Any] = {"workload": args.workload, "definition": workload, "machine": machine_info(),
                              "compute_limit_output_tokens_per_s": round(limit, 1),
                              "fraction_of_compute_limit": round(ours["output_tokens_per_s"] / limit, 3)}
    if args.baseline_engine_arg:
        baseline_args = {**parse_engine_args(args), **parse_pairs(args.baseline_engine_arg)}
        baseline = run_in_child(run_pagedllm, prompts, output_len, baseline_args)
        ratio = ours["output_tokens_per_s"] / baseline["output_tokens_per_s"]
        print(f"pagedllm with {baseline_args}: {baseline['output_tokens_per_s']:.1f} output tok/s, peak RSS "
              f"{baseline['peak_rss_mib']:.0f} MiB; ratio {ratio:.2f}x", flush=True)
        result["agreement_with_pagedllm_baseline"] = _agreement(ours["output_token_ids"],
                                                                baseline.pop("output_token_ids"))
        result["pagedllm_baseline"] = baseline
        result["ratio_vs_pagedllm_baseline"] = round(ratio, 3)
    if args.workload == "throughput_large":  # its target: continuous batching keeps the rate of `throughput`
        small = load_workload("throughput", args.workloads_file)
        static = run_in_child(run_pagedllm, token_prompts(small, small["num_prompts"]), small["output_len"],
                              parse_engine_args(args))
        ratio = ours["output_tokens_per_s"] / static["output_tokens_per_s"]
        print(f"pagedllm on throughput ({small['num_prompts']} requests): {static['output_tokens_per_s']:.1f} output "
              f"tok/s; ratio {ratio:.2f}x (target {TARGET_LARGE_RATIO}x)", flush=True)
        static.pop("output_token_ids")
        result["pagedllm_on_throughput"] = static
        result["ratio_vs_throughput"] = round(ratio, 3)
        result["target_ratio_vs_throughput"] = TARGET_LARGE_RATIO
    if args.vllm_python:
        result.update(_vllm_comparison(args, prompts, output_len, ours))
    if not args.no_hf:
        batch_sizes = [int(b) for b in args.hf_batch_sizes.split(",")]
        theirs = run_in_child(run_transformers, prompts, output_len, batch_sizes, benchmark_device(args))
        ratio = ours["output_tokens_per_s"] / theirs["output_tokens_per_s"]
        print(f"transformers (batch {theirs['best_batch_size']}): {theirs['output_tokens_per_s']:.1f} output tok/s, "
              f"peak RSS {theirs['peak_rss_mib']:.0f} MiB", flush=True)
        print(f"ratio pagedllm / transformers: {ratio:.2f}x (target {TARGET_RATIO}x)", flush=True)
        result["agreement_with_transformers"] = _agreement(ours["output_token_ids"], theirs.pop("output_token_ids"))
        result["transformers"] = theirs
        result["ratio_vs_transformers"] = round(ratio, 3)
        result["target_ratio"] = TARGET_RATIO
    ours.pop("output_token_ids")
    result["pagedllm"] = ours
    print(f"wrote {write_result(result, args.output, args.workload)}")
    return result


if __name__ == "__main__":
    main()
