"""Online serving benchmark: the `serving` workload sent to an OpenAI-compatible server, streaming.

Requests arrive as a Poisson process at the workload's rate; each streams its completion and we time the
first token (TTFT) and the mean time per later output token (TPOT). With no --url the script starts
`pagedllm serve` on a free local port and stops it at the end. As a baseline from the same invocation it
then runs the same requests offline through `LLM.generate` (all at once), and reports the server's output
tokens/s as a ratio of that (skip it with --no-baseline).

--compare-frontends also starts the server with --disable-frontend-multiprocessing (the engine in the server's
process) and sends the same requests to both, one form after the other at each rate (the workload's, then
--sustainable-rate, one this machine keeps up with), so that their ratio comes from one invocation; the order
of the two forms alternates from one rate to the next.

Request i draws from numpy.random.default_rng(seed): first all input lengths, then all output lengths
(uniform, both ends included), then each prompt's token ids, then the inter-arrival gaps.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import httpx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import load_workload  # noqa: E402
from pagedllm.entrypoints.openai.launch import launch_server  # noqa: E402


@dataclass
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int
    send_at: float  # seconds after the start


@dataclass
class Result:
    ok: bool
    ttft: float = 0.0
    latency: float = 0.0
    output_tokens: int = 0
    error: str = ""


def make_requests(workload: dict, num_requests: int, rate: float) -> list[BenchRequest]:
    rng = np.random.default_rng(workload["seed"])
    in_lo, in_hi = workload["input_len_range"]
    out_lo, out_hi = workload["output_len_range"]
    input_lens = rng.integers(in_lo, in_hi + 1, size=num_requests)
    output_lens = rng.integers(out_lo, out_hi + 1, size=num_requests)
    prompts = [rng.integers(workload["token_id_low"], workload["token_id_high"], size=int(n)).tolist()
               for n in input_lens]
    send_at = np.cumsum(rng.exponential(1.0 / rate, size=num_requests)) if rate > 0 else np.zeros(num_requests)
    return [BenchRequest(p, int(o), float(t)) for p, o, t in zip(prompts, output_lens, send_at)]


async def send(client: httpx.AsyncClient, model: str, request: BenchRequest, start: float) -> Result:
    await asyncio.sleep(max(0.0, start + request.send_at - time.perf_counter()))
    body = {"model": model, "prompt": request.prompt_token_ids, "max_tokens": request.output_len,
            "temperature": 0.0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    ttft, tokens = None, 0
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                return Result(False, error=f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                if "error" in chunk:
                    return Result(False, error=chunk["error"]["message"])
                if chunk["choices"] and ttft is None:
                    ttft = time.perf_counter() - sent
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
    except httpx.HTTPError as error:
        return Result(False, error=f"{type(error).__name__}: {error}")
    return Result(True, ttft or 0.0, time.perf_counter() - sent, tokens)


async def run_load(url: str, model: str, requests: list[BenchRequest], api_key: Optional[str]
                   ) -> tuple[list[Result], float]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=len(requests), max_keepalive_connections=len(requests))
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=None, limits=limits) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(send(client, model, r, start) for r in requests))
        return list(results), time.perf_counter() - start


def _percentiles(values: list[float], scale: float = 1000.0) -> dict[str, Optional[float]]:
    if not values:
        return {"mean": None, "p50": None, "p99": None}
    array = np.asarray(values) * scale
    return {"mean": float(array.mean()), "p50": float(np.percentile(array, 50)),
            "p99": float(np.percentile(array, 99))}


def summarize(results: list[Result], duration: float) -> dict:
    done = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    return {
        "completed": len(done), "errors": len(results) - len(done),
        "error_examples": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration, "request_throughput_per_s": len(done) / duration,
        "output_tokens": output_tokens, "output_tokens_per_s": output_tokens / duration,
        "ttft_ms": _percentiles([r.ttft for r in done]), "tpot_ms": _percentiles(tpots),
        "e2e_latency_ms": _percentiles([r.latency for r in done]),
    }


def offline_baseline(requests: list[BenchRequest], engine_flags: list[str]) -> dict:
    """The same requests through `LLM.generate` at once: the engine's capacity without HTTP or arrivals."""
    from pagedllm import LLM, SamplingParams
    from pagedllm.config import EngineArgs

    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    engine_args = vars(EngineArgs.from_cli_args(parser.parse_args(engine_flags)))
    llm = LLM(**engine_args)
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
    params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=r.output_len) for r in requests]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    duration = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"duration_s": duration, "output_tokens": tokens, "output_tokens_per_s": tokens / duration}


def measure(url: str, requests: list[BenchRequest], api_key: Optional[str]) -> tuple[list[Result], float]:
    """Send the requests to the server at `url` (without /v1) under the first model it lists."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    model = httpx.get(f"{url}/v1/models", headers=headers).json()["data"][0]["id"]
    return asyncio.run(run_load(url, model, requests, api_key))


FORMS = {"engine_process": [], "in_process": ["--disable-frontend-multiprocessing"]}


def compare_frontends(requests_at: Callable[[float], list[BenchRequest]], rates: list[float],
                      engine_flags: list[str]) -> dict:
    """Both server forms up at once, measured one after the other at each rate (order alternating), with
    the ratio of the engine process's figures to the in-process ones."""
    with contextlib.ExitStack() as stack:
        urls = {form: stack.enter_context(launch_server(["--disable-log-requests", *flags, *engine_flags]))
                for form, flags in FORMS.items()}
        runs = {}
        for i, rate in enumerate(rates):
            requests, order = requests_at(rate), list(FORMS)[::1 if i % 2 == 0 else -1]
            run = {form: summarize(*measure(urls[form], requests, None)) for form in order}
            run["order"] = order
            mp, inproc = run["engine_process"], run["in_process"]
            run["engine_process_vs_in_process"] = {
                "output_tokens_per_s": mp["output_tokens_per_s"] / inproc["output_tokens_per_s"],
                "ttft_p50": mp["ttft_ms"]["p50"] / inproc["ttft_ms"]["p50"],
                "ttft_p99": mp["ttft_ms"]["p99"] / inproc["ttft_ms"]["p99"]}
            print(json.dumps({"rate": rate, **run["engine_process_vs_in_process"]}), file=sys.stderr, flush=True)
            runs[f"{rate:g}_per_s"] = run
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=None, help="A running server (without /v1); default: start one.")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--workloads-file", default=None, help="workloads.json (default: ../shared/bench)")
    parser.add_argument("--num-requests", type=int, default=None, help="Fewer requests for a quick check.")
    parser.add_argument("--output", default=None, help="Write the JSON result here too.")
    parser.add_argument("--no-baseline", action="store_true", help="Skip the offline LLM.generate baseline.")
    parser.add_argument("--compare-frontends", action="store_true",
                        help="Engine in its own process against in the server's, at two rates (no --url).")
    parser.add_argument("--sustainable-rate", type=float, default=1.0,
                        help="The second rate of --compare-frontends, requests/s (default 1.0).")
    parser.add_argument("engine_flags", nargs=argparse.REMAINDER,
                        help="After `--`: EngineArgs flags for the started server and the baseline.")
    args = parser.parse_args()
    engine_flags = [f for f in args.engine_flags if f != "--"]
    workload = load_workload("serving", args.workloads_file)
    num_requests = args.num_requests or workload["num_requests"]
    requests = make_requests(workload, num_requests, workload["request_rate_per_s"])
    report: dict = {"workload": {**workload, "num_requests": num_requests}}
    if args.compare_frontends:
        if args.url:
            parser.error("--compare-frontends starts its own servers; it takes no --url.")
        rates = [workload["request_rate_per_s"], args.sustainable_rate]
        report["frontends"] = compare_frontends(lambda rate: make_requests(workload, num_requests, rate), rates,
                                                engine_flags)
        report["server"] = report["frontends"][f"{rates[0]:g}_per_s"]["engine_process"]
    else:
        server = (contextlib.nullcontext(args.url) if args.url
                  else launch_server(["--disable-log-requests", *engine_flags]))
        with server as url:
            report["server"] = summarize(*measure(url, requests, args.api_key))
    print(json.dumps(report["server"]), file=sys.stderr, flush=True)
    if not args.no_baseline:
        report["offline_baseline"] = offline_baseline(requests, engine_flags)
        report["server_vs_offline_output_tokens_per_s"] = (report["server"]["output_tokens_per_s"]
                                                           / report["offline_baseline"]["output_tokens_per_s"])
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")


if __name__ == "__main__":
    main()
