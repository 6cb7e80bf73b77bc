"""Soak test: many requests of a realistic mix against `pagedllm serve`, then check that nothing leaked.

Request i draws its shape from random.Random(seed + i): completion or chat, streamed or not, n of 1 or 2,
guided (choice, regex or JSON) for some; 30% of streamed requests are dropped by the client after a random
number of events, and some requests give up on a client timeout shorter than their generation. The report
counts completed requests, the intended drops and timeouts, and errors by kind (which should be none); then
reads /metrics until nothing is running or waiting and the KV cache usage is back to 0.

Memory: the resident set of the server and engine processes is sampled every 5% of the requests; the first
`--warmup` requests are a warm-up phase, and growth is measured from its end to the end of the run, both
taken once the server has settled.
On CPU the KV cache lives in memory the kernel backs only where written, so resident memory rises with the
blocks touched so far, up to the cache's size: a leak-hunting run wants a cache the warm-up cycles through.
The script therefore starts its server with --num-gpu-blocks-override 512 (360 MiB on the default model)
unless the flags after `--` size the cache themselves.

With no --url the script starts `pagedllm serve` (flags after `--` go to it) and stops it at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import write_result  # noqa: E402
from pagedllm.entrypoints.openai.launch import launch_server_process  # noqa: E402

DROP_FRACTION = 0.3
TIMEOUT_FRACTION = 0.05
CLIENT_TIMEOUT_S = 0.05
SOAK_NUM_BLOCKS = 512  # a KV cache the warm-up writes all of (see the module docstring)
CACHE_SIZE_FLAGS = {"--num-gpu-blocks-override", "--kv-cache-memory"}
TOPICS = ["the sea", "a paged KV cache", "autumn", "a small robot", "the number seven", "tea"]


@dataclass
class SoakRequest:
    path: str
    body: dict[str, Any]
    drop_after: Optional[int]  # a streamed request the client leaves after this many events
    client_timeout: Optional[float]


def make_request(i: int, seed: int, max_tokens: int) -> SoakRequest:
    rng = random.Random(seed + i)
    topic = rng.choice(TOPICS)
    stream = rng.random() < 0.5
    body: dict[str, Any] = {"max_tokens": rng.randint(1, max_tokens), "stream": stream,
                            "n": 2 if rng.random() < 0.15 else 1, "temperature": rng.choice([0.0, 0.7, 1.0]),
                            "seed": rng.randint(0, 2**31)}
    if body["temperature"] == 0.0:
        body["n"] = 1
    guided = rng.random()
    if guided < 0.05:
        body["guided_choice"] = ["yes", "no", "maybe"]
    elif guided < 0.10:
        body["guided_regex"] = "[a-z]{1,8}( [a-z]{1,8}){0,3}"
    elif guided < 0.12:
        body["guided_json"] = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    if rng.random() < 0.5:
        path, body["prompt"] = "/v1/completions", f"A few words about {topic}:"
    else:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": f"Tell me about {topic}."}]
    drop_after = rng.randint(1, max(1, body["max_tokens"] // 2)) if stream and rng.random() < DROP_FRACTION else None
    timeout = CLIENT_TIMEOUT_S if drop_after is None and rng.random() < TIMEOUT_FRACTION else None
    return SoakRequest(path, body, drop_after, timeout)


@dataclass
class Tally:
    outcomes: collections.Counter = field(default_factory=collections.Counter)  # completed, dropped, timed out
    errors: collections.Counter = field(default_factory=collections.Counter)  # by kind
    error_examples: dict[str, str] = field(default_factory=dict)

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        self.error_examples.setdefault(kind, detail[:300])


async def send(client: httpx.AsyncClient, request: SoakRequest, tally: Tally) -> None:
    timeout = request.client_timeout or 300.0
    try:
        if not request.body["stream"]:
            response = await client.post(request.path, json=request.body, timeout=timeout)
            if response.status_code == 200:
                tally.outcomes["completed"] += 1
            else:
                tally.error(f"http {response.status_code}", response.text)
            return
        async with client.stream("POST", request.path, json=request.body, timeout=timeout) as response:
            if response.status_code != 200:
                tally.error(f"http {response.status_code}", (await response.aread()).decode(errors="replace"))
                return
            events = 0
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if '"error"' in line[:20]:
                    tally.error("stream error event", line)
                    return
                events += 1
                if request.drop_after is not None and events >= request.drop_after:
                    tally.outcomes["dropped by client"] += 1
                    return
            tally.outcomes["completed"] += 1
    except httpx.TimeoutException as error:
        if request.client_timeout is not None:
            tally.outcomes["client timeout"] += 1
        else:
            tally.error(type(error).__name__, str(error))
    except httpx.HTTPError as error:
        tally.error(type(error).__name__, str(error))


def _gauge(metrics: str, name: str) -> float:
    values = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", metrics, re.M)
    return sum(float(v) for v in values)


async def settled_metrics(client: httpx.AsyncClient, timeout: float = 60.0) -> dict[str, float]:
    """/metrics once nothing runs or waits and the cache is empty (or as it is after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        text = (await client.get("/metrics")).text
        values = {name: _gauge(text, f"vllm:{name}") for name in
                  ("num_requests_running", "num_requests_waiting", "num_requests_swapped", "gpu_cache_usage_perc")}
        if not any(values.values()) or time.monotonic() > deadline:
            return values
        await asyncio.sleep(0.2)


def rss_mib(pids: dict[str, int]) -> dict[str, float]:
    sizes = {}
    for name, pid in pids.items():
        try:
            with open(f"/proc/{pid}/status") as status:
                kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
            sizes[name] = round(kib / 1024, 1)
        except (OSError, StopIteration):
            continue
    return sizes


def _growth_pct(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: round(100 * (after[name] - before[name]) / before[name], 2)
            for name in before if name in after and before[name]}


async def soak(url: str, num_requests: int, concurrency: int, seed: int, max_tokens: int,
               api_key: Optional[str] = None, pids: Optional[dict[str, int]] = None,
               warmup: int = 0) -> dict[str, Any]:
    """Send the requests, `concurrency` at a time; the report as a dict.

    The first `warmup` requests run as a phase of their own: as it drains, the batch shrinks through every
    size, so the engine's per-size caches (CPU graphs) are built before the memory baseline is taken; the
    run ends with the same drain. The resident memory of `pids` is sampled every 5% of the requests.
    """
    pids = pids or {}
    tally = Tally()
    samples: list[dict[str, Any]] = [{"done": 0, **rss_mib(pids)}]
    every = max(1, num_requests // 20)
    middle = warmup + (num_requests - warmup) // 2
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    started = time.monotonic()
    done = 0
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits) as client:

        async def run_phase(indices: range) -> dict[str, float]:
            """Send `indices` and wait until the server has settled; its /metrics then."""
            pending = iter(indices)

            async def worker() -> None:
                nonlocal done
                for i in pending:
                    await send(client, make_request(i, seed, max_tokens), tally)
                    done += 1
                    if done % every == 0 or done == middle:
                        samples.append({"done": done, **rss_mib(pids)})

            await asyncio.gather(*(worker() for _ in range(concurrency)))
            settled = await settled_metrics(client)
            samples.append({"done": done, "settled": True, **rss_mib(pids)})
            return settled

        if warmup:
            await run_phase(range(warmup))
        baseline = samples[-1]
        after = await run_phase(range(warmup, num_requests))
        elapsed = time.monotonic() - started

    def memory_of(sample: dict[str, Any]) -> dict[str, float]:
        return {name: sample[name] for name in pids if name in sample}

    middle_sample = next(s for s in samples if s["done"] >= middle)
    memory = {"start": memory_of(baseline), "middle": memory_of(middle_sample), "end": memory_of(samples[-1])}
    return {"num_requests": num_requests, "warmup_requests": warmup, "concurrency": concurrency, "seed": seed,
            "elapsed_s": round(elapsed, 1), "outcomes": dict(tally.outcomes), "errors": dict(tally.errors),
            "error_examples": tally.error_examples, "metrics_after": after, "rss_mib": memory,
            "rss_growth_after_warmup_pct": _growth_pct(memory["start"], memory["end"]), "rss_samples_mib": samples}


def engine_pid(log_path: Path) -> Optional[int]:
    found = re.search(r"Started the engine process \(pid (\d+)\)", log_path.read_text(errors="replace"))
    return int(found.group(1)) if found else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=None, help="A running server (without /v1); default: start one.")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32, help="Each request asks for 1 to this many tokens.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=None,
                        help="Requests before the memory baseline (default: a fifth of them).")
    parser.add_argument("--output", default=None, help="Write the JSON result here too.")
    parser.add_argument("server_flags", nargs=argparse.REMAINDER, help="After `--`: flags for `pagedllm serve`.")
    args = parser.parse_args()
    flags = [f for f in args.server_flags if f != "--"]
    if not any(f.split("=")[0] in CACHE_SIZE_FLAGS for f in flags):
        flags += ["--num-gpu-blocks-override", str(SOAK_NUM_BLOCKS)]
    warmup = args.num_requests // 5 if args.warmup is None else args.warmup
    run = dict(num_requests=args.num_requests, concurrency=args.concurrency, seed=args.seed,
               max_tokens=args.max_tokens, api_key=args.api_key, warmup=warmup)
    if args.url:
        result = asyncio.run(soak(args.url, **run))
    else:
        log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"soak-server-{os.getpid()}.log"
        with launch_server_process(flags, log_path) as (url, process):
            pids = {"server": process.pid, "engine": engine_pid(log_path)}
            result = asyncio.run(soak(url, pids={k: v for k, v in pids.items() if v}, **run))
        result["server_flags"] = flags
    print(json.dumps(result, indent=2))
    print("Wrote", write_result(result, args.output, "soak"))


if __name__ == "__main__":
    main()
