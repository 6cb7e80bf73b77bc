"""Latency of one request at a time: time to first token (TTFT) and mean time per output token (TPOT), each
against the machine's own limit measured in the same invocation.

    python benchmarks/latency.py            # pagedllm and transformers at batch 1
    python benchmarks/latency.py --no-hf    # pagedllm only
    python benchmarks/latency.py --device cuda   # on a GPU (the default where there is one): its own limits
    python benchmarks/latency.py --no-hf --baseline-engine-arg speculative_config=null \
        --engine-arg 'speculative_config={"method": "draft_model", "quantization": "int8", "num_speculative_tokens": 4}'
                                            # speculative decoding against plain decoding, interleaved
    python benchmarks/latency.py --no-hf --engine-arg dtype=bfloat16 --baseline-engine-arg dtype=float32
    python benchmarks/latency.py --no-hf --llama-cpp-python ~/llama-cpp/bin/python   # and llama.cpp, batch 1

Each repeat runs its own prompt of the `latency` workload (so no prefix cache can help), after one
warm-up request; the median over repeats is reported, with the transformers batch-1 figures of the same
invocation and their ratios. Before and after the engines, the machine's memory-streaming rate (a timed sum
over a buffer of the weights' size) and float32 matmul rate are measured (machine_limits.py, best of both):
TPOT is printed as a ratio to the streaming limit (weights' bytes over the streaming rate) and TTFT to the
prefill compute limit (the prompt's FLOPs over the matmul rate). On a shared machine the memory's rate can move
by 2x within a minute (26 to 54 GB/s on a 2-core AMD Zen 4), so pagedllm's process also times the streaming
read right before and after each request, and the JSON gives the median over requests of each TPOT against
the limit at that rate (`tpot_vs_adjacent_stream_limit`) beside the ratio to the best rate of the invocation.
Those limits count the weights' float32 (or bfloat16, int8) bytes; an engine that holds them in fewer (the
default model's GGUF blocks, weight_blocks.py) also gets `tpot_vs_decode_bytes_limit`, against the bytes of
weights it actually reads per token at the rate beside each request.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (add_engine_args, benchmark_device, common_prefix_lengths, decode_weight_bytes,  # noqa: E402
                               default_model_flops, load_hf_model, load_workload, machine_info, parse_engine_args,
                               parse_pairs, run_in_child, token_prompts, write_result)
from benchmarks.llama_cpp_baseline import run_llama_cpp  # noqa: E402
from benchmarks.machine_limits import cpu_flags, measure_limits, stream_timer  # noqa: E402

TARGET_TPOT_S = 0.020
TARGET_TTFT_S = 0.17
TARGET_TPOT_VS_STREAM = 1.25  # at most this many times the memory-streaming limit
TARGET_TTFT_VS_COMPUTE = 1.2  # at most this many times the prefill compute limit


def run_pagedllm(prompts: list[list[int]], output_len: int, engines: dict[str, dict[str, Any]], stream_bytes: int = 0,
                 device: str = "cpu", rounds: int = 1) -> dict[str, dict[str, Any]]:
    """Each engine's runs of the prompts, by name. The engines live in this one process and take turns
    request by request, `rounds` times per prompt (the order reversed every other round), each keeping its
    fastest run of a prompt, so that all meet the same conditions of a shared machine. Where stream_bytes is
    given, the streaming rate over that many bytes is measured right before and right after each request (the
    better of the two), so that each run's TPOT meets the rate the memory had at that time."""
    from pagedllm import LLM, SamplingParams

    llms, startup_s = {}, {}
    for name, kwargs in engines.items():
        start = time.perf_counter()
        llms[name] = LLM(**kwargs).llm_engine
        startup_s[name] = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    stream = stream_timer(stream_bytes, device, repeats=2) if stream_bytes else None
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    counts = {name: [0, 0] for name in engines}  # proposals verified, accepted
    tokens: dict[str, list[list[int]]] = {name: [] for name in engines}  # each prompt's output (greedy: any run)
    for i, prompt in enumerate(prompts):
        fastest: dict[str, dict[str, float]] = {}
        for r in range(rounds):
            for name in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
                rate_before = stream() if stream else 0.0
                run = _request(llms[name], f"latency-{i}-{r}", prompt, params, output_len, counts[name],
                               tokens[name] if r == 0 else [])
                if stream:
                    run["stream_bytes_per_s"] = max(rate_before, stream())
                if name not in fastest or run["tpot_s"] < fastest[name]["tpot_s"]:
                    fastest[name] = run
        for name in engines:
            runs[name].append(fastest[name])
    results = {}
    for name, kwargs in engines.items():
        results[name] = {**_summary(runs[name][1:]), "startup_s": round(startup_s[name], 2), "engine_args": kwargs,
                         "decode_weight_bytes": decode_weight_bytes(llms[name]), "output_token_ids": tokens[name][1:]}
        spec, (verified, accepted) = kwargs.get("speculative_config"), counts[name]
        if spec and verified:  # accepted proposals over proposals verified (all runs)
            results[name]["acceptance_rate"] = round(accepted / (verified * spec["num_speculative_tokens"]), 3)
    return results


def _request(engine: Any, request_id: str, prompt: list[int], params: Any, output_len: int,
             counts: list[int], outputs: list[list[int]]) -> dict[str, float]:
    """One request alone on the engine, timed; its speculative proposals verified and accepted are added to
    counts, and its output tokens to outputs."""
    from pagedllm import TokensPrompt

    engine.reset_prefix_cache()  # every run computes its prompt: a prompt runs once per round
    start = time.perf_counter()
    engine.add_request(request_id, TokensPrompt(prompt_token_ids=prompt), params)
    first = end = None
    num_tokens = 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            if first is None and output.outputs[0].token_ids:
                first = time.perf_counter()
            if output.finished:
                end = time.perf_counter()
                num_tokens = len(output.outputs[0].token_ids)
                outputs.append(list(output.outputs[0].token_ids))
                spec = output.metrics.spec_token_acceptance_counts or [0]
                counts[0], counts[1] = counts[0] + spec[0], counts[1] + sum(spec[1:])
    return _run(start, first, end, num_tokens, output_len)


def run_transformers(prompts: list[list[int]], output_len: int, device: str = "cpu") -> dict[str, Any]:
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

    model = load_hf_model(device)
    runs = []
    with torch.inference_mode():
        for prompt in prompts:
            clock = Clock()
            input_ids = torch.tensor([prompt], device=device)
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
    parser.add_argument("--baseline-engine-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="also run pagedllm with its engine args changed by these (repeatable; null unsets one), "
                             "taking turns request by request, each its fastest of --rounds per prompt, and print "
                             "the ratios")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each prompt per engine with --baseline-engine-arg")
    parser.add_argument("--llama-cpp-python", default=None, metavar="PATH",
                        help="also run llama.cpp on the default model's GGUF file, batch 1, through llama-cpp-python "
                             "installed for this interpreter (a separate environment), and print the ratios")
    parser.add_argument("--output", default=None, help="JSON file (default: benchmarks/results/latency-<time>.json)")
    args = parser.parse_args(argv)

    workload = load_workload("latency", args.workloads_file)
    # One extra prompt first: the warm-up run.
    prompts = token_prompts(workload, workload["repeats"] + 1)
    output_len = workload["output_len"]
    engine_kwargs = parse_engine_args(args)
    device = benchmark_device(args)
    weight_size = _bytes_per_weight(engine_kwargs, device)
    before = run_in_child(measure_limits, weight_size, device)
    if args.baseline_engine_arg:
        baseline_kwargs = {key: value for key, value in {**engine_kwargs, **parse_pairs(args.baseline_engine_arg)}.items()
                           if value is not None}
        ours, baseline = _run_engines(prompts, output_len, {"ours": engine_kwargs, "baseline": baseline_kwargs},
                                      before["weight_bytes"], device, args.rounds)
    else:
        (ours,) = _run_engines(prompts, output_len, {"ours": engine_kwargs}, before["weight_bytes"], device, 1)
    limits = _best_limits(before, run_in_child(measure_limits, weight_size, device))
    stream_limit = limits["weight_bytes"] / limits["stream_bytes_per_s"]
    prefill_limit = default_model_flops(workload["input_len"], 1) / limits["matmul_flops_per_s"]
    vs_limits = {"tpot_vs_stream_limit": round(ours["tpot_s"] / stream_limit, 3),
                 "tpot_vs_adjacent_stream_limit": round(statistics.median(
                     run["tpot_s"] * run["stream_bytes_per_s"] / limits["weight_bytes"] for run in ours["repeats"]), 3),
                 "ttft_vs_compute_limit": round(ours["ttft_s"] / prefill_limit, 3)}
    if ours["decode_weight_bytes"]:  # the bytes the engine's weights take as it streams them
        vs_limits["tpot_vs_decode_bytes_limit"] = round(statistics.median(
            run["tpot_s"] * run["stream_bytes_per_s"] / ours["decode_weight_bytes"] for run in ours["repeats"]), 3)
    print(f"machine: {machine_info()['cpu']} ({' '.join(cpu_flags())}), streams "
          f"{limits['stream_bytes_per_s'] / 1e9:.1f} GB/s, matmul {limits['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s "
          f"on {limits['threads']} threads", flush=True)
    print(f"pagedllm: TTFT {ours['ttft_s'] * 1e3:.0f} ms = {vs_limits['ttft_vs_compute_limit']:.2f}x the compute "
          f"limit {prefill_limit * 1e3:.0f} ms (target {TARGET_TTFT_VS_COMPUTE}x); TPOT {ours['tpot_s'] * 1e3:.1f} ms = "
          f"{vs_limits['tpot_vs_stream_limit']:.2f}x the streaming limit {stream_limit * 1e3:.1f} ms "
          f"({limits['weight_bytes'] / 1e6:.0f} MB of weights; target {TARGET_TPOT_VS_STREAM}x), "
          f"{vs_limits['tpot_vs_adjacent_stream_limit']:.2f}x the limit at the rate measured beside each request"
          + (f", {vs_limits['tpot_vs_decode_bytes_limit']:.2f}x the limit of the "
             f"{ours['decode_weight_bytes'] / 1e6:.0f} MB its weights take as the engine holds them"
             if "tpot_vs_decode_bytes_limit" in vs_limits else "") + "; "
          f"start {ours['startup_s']:.1f} s, peak RSS {ours['peak_rss_mib']:.0f} MiB", flush=True)
    result: dict[str, Any] = {"workload": "latency", "definition": workload,
                              "machine": {**machine_info(), "cpu_flags": cpu_flags(), **limits},
                              "stream_limit_tpot_s": round(stream_limit, 4),
                              "prefill_compute_limit_s": round(prefill_limit, 4), **vs_limits,
                              "targets": {"ttft_s": TARGET_TTFT_S, "tpot_s": TARGET_TPOT_S,
                                          "tpot_vs_stream_limit": TARGET_TPOT_VS_STREAM,
                                          "ttft_vs_compute_limit": TARGET_TTFT_VS_COMPUTE}, "pagedllm": ours}
    if args.baseline_engine_arg:
        result["pagedllm_baseline"] = {"engine_args": baseline_kwargs, **baseline}
        baseline_bytes = limits["weight_bytes"] * _bytes_per_weight(baseline_kwargs, device) // weight_size
        result["pagedllm_baseline"]["tpot_vs_adjacent_stream_limit"] = round(statistics.median(
            run["tpot_s"] * run["stream_bytes_per_s"] / baseline_bytes for run in baseline["repeats"]), 3)
        result["vs_pagedllm_baseline"] = {"ttft": round(ours["ttft_s"] / baseline["ttft_s"], 3),
                                          "tpot": round(ours["tpot_s"] / baseline["tpot_s"], 3)}
        ratios = result["vs_pagedllm_baseline"]
        acceptance = f", acceptance {ours['acceptance_rate']}" if ours.get("acceptance_rate") is not None else ""
        print(f"pagedllm with {baseline_kwargs}: TTFT {baseline['ttft_s'] * 1e3:.0f} ms, TPOT "
              f"{baseline['tpot_s'] * 1e3:.1f} ms; ours against it: TTFT {ratios['ttft']:.2f}x, "
              f"TPOT {ratios['tpot']:.2f}x{acceptance}; its TPOT "
              f"{result['pagedllm_baseline']['tpot_vs_adjacent_stream_limit']:.2f}x the limit of its own weights at the "
              f"rate measured beside each request", flush=True)
    if args.llama_cpp_python:
        result.update(_llama_cpp_comparison(args.llama_cpp_python, prompts, output_len, ours))
    if not args.no_hf:
        theirs = run_in_child(run_transformers, prompts, output_len, device)
        print(f"transformers (batch 1): TTFT {theirs['ttft_s'] * 1e3:.0f} ms, TPOT {theirs['tpot_s'] * 1e3:.1f} ms, "
              f"peak RSS {theirs['peak_rss_mib']:.0f} MiB", flush=True)
        result["transformers"] = theirs
        result["speedup_vs_transformers"] = {"ttft": round(theirs["ttft_s"] / ours["ttft_s"], 3),
                                             "tpot": round(theirs["tpot_s"] / ours["tpot_s"], 3)}
        print(f"speed-up vs transformers: TTFT {result['speedup_vs_transformers']['ttft']:.2f}x, "
              f"TPOT {result['speedup_vs_transformers']['tpot']:.2f}x", flush=True)
    print(f"wrote {write_result(result, args.output, 'latency')}")
    return result


def _llama_cpp_comparison(python: str, prompts: list[list[int]], output_len: int,
                          ours: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's batch-1 figures on the same prompts, their ratios to ours, and how many leading tokens of each
    output agree (llama.cpp rounds activations to 8 bits for its Q4_1 products; we compute in float32)."""
    theirs = run_llama_cpp(python, prompts, output_len)
    agree = common_prefix_lengths(ours["output_token_ids"], theirs["output_token_ids"])
    speedup = {"ttft": round(theirs["ttft_s"] / ours["ttft_s"], 3), "tpot": round(theirs["tpot_s"] / ours["tpot_s"], 3)}
    print(f"llama.cpp {theirs['llama_cpp_version']} (batch 1, {theirs['threads']} threads): TTFT "
          f"{theirs['ttft_s'] * 1e3:.0f} ms, TPOT {theirs['tpot_s'] * 1e3:.1f} ms; pagedllm against it: TTFT "
          f"{speedup['ttft']:.2f}x, TPOT {speedup['tpot']:.2f}x faster; leading tokens in agreement per prompt: "
          f"{agree} of {output_len}", flush=True)
    return {"llama_cpp": theirs, "speedup_vs_llama_cpp": speedup, "llama_cpp_leading_tokens_agreeing": agree}


def _run_engines(prompts: list[list[int]], output_len: int, engines: dict[str, dict[str, Any]], stream_bytes: int,
                 device: str, rounds: int) -> list[dict[str, Any]]:
    """run_pagedllm in a fresh process; each engine's figures, with that process's peak RSS (of all its engines)."""
    results = run_in_child(run_pagedllm, prompts, output_len, engines, stream_bytes, device, rounds)
    return [{**results[name], "peak_rss_mib": results["peak_rss_mib"], "engines_in_process": len(engines)}
            for name in engines]


def _bytes_per_weight(engine_kwargs: dict[str, Any], device: str) -> int:
    """Bytes each weight of the linear layers takes in memory under these engine arguments (dtype "auto" is
    bfloat16 on CUDA)."""
    if engine_kwargs.get("quantization") == "int8":
        return 1
    dtype = engine_kwargs.get("dtype", "auto")
    return 2 if dtype in ("bfloat16", "float16", "half") or (dtype == "auto" and device == "cuda") else 4


def _best_limits(*runs: dict[str, Any]) -> dict[str, Any]:
    """The machine's rates at their best over the runs: other work on the machine only ever lowers them."""
    return {**runs[0], "stream_bytes_per_s": max(r["stream_bytes_per_s"] for r in runs),
            "matmul_flops_per_s": max(r["matmul_flops_per_s"] for r in runs)}


if __name__ == "__main__":
    main()
