"""Faults around the engine process behind `pagedllm serve`: killed mid-stream, SIGTERM under load, and a
KV cache too small for the load."""
from __future__ import annotations

import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytestmark = pytest.mark.slow

PROMPT = "The best way to learn a new language is"


def _engine_pid(server) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = re.search(r"Started the engine process \(pid (\d+)\)", server.log())
        if found:
            return int(found.group(1))
        time.sleep(0.1)
    raise AssertionError("The server did not log its engine process.")


def _gone(pid: int) -> bool:
    """True once `pid` has exited (a zombie not yet reaped by its parent counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1].startswith("Z")
    except FileNotFoundError:
        return True


def _metric(metrics: str, name: str) -> float:
    """The sum of a metric's samples over their labels (0 before the first)."""
    return sum(float(value) for value in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", metrics, re.M))


def _wait_received(url: str, count: int, timeout: float = 60) -> None:
    """Wait until the engine has received `count` requests: running, waiting or already finished (a short
    request can finish before the last of the others arrives, so that they are never all held at once)."""
    deadline = time.monotonic() + timeout
    names = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:request_success_total")
    while time.monotonic() < deadline:
        metrics = httpx.get(f"{url}/metrics").text
        if sum(_metric(metrics, name) for name in names) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"The engine never received {count} requests.")


def _stream_events(response: httpx.Response):
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: "):])


def _complete(url: str, max_tokens: int, stream: bool, timeout: float = 120) -> dict:
    """A completion's outcome: finish reasons and completion tokens, or the error it ended with."""
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
    try:
        if not stream:
            response = httpx.post(f"{url}/v1/completions", json=body, timeout=timeout)
            whole = response.json()
            return {"status": response.status_code, "error": whole.get("error"),
                    "finish_reason": whole["choices"][0]["finish_reason"] if "choices" in whole else None}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=timeout) as response:
            events = list(_stream_events(response))
        errors = [e["error"] for e in events if "error" in e]
        texts = [c for e in events if "choices" in e for c in e["choices"]]
        return {"status": response.status_code, "error": errors[0] if errors else None,
                "finish_reason": texts[-1]["finish_reason"] if texts else None}
    except httpx.HTTPError as error:  # the connection closed under the request
        return {"status": None, "error": type(error).__name__}


def test_killed_engine_process_ends_streams_and_health_at_once(tiny_model_dir, launch_server, tmp_path):
    args = [tiny_model_dir, "--max-model-len", "512", "--num-gpu-blocks-override", "64"]
    with launch_server(tmp_path, args) as server:
        engine_pid = _engine_pid(server)
        body = {"prompt": PROMPT, "max_tokens": 480, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
            events = _stream_events(response)
            assert "choices" in next(events)
            os.kill(engine_pid, signal.SIGKILL)
            killed = time.monotonic()
            rest = list(events)
        ended_after = time.monotonic() - killed
        health = httpx.get(f"{server.url}/health", timeout=5)
        after = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=5)
        log = server.log()
    assert ended_after < 5
    assert rest and rest[-1]["error"]["code"] == 503 and "engine process" in rest[-1]["error"]["message"]
    assert health.status_code == 503 and after.status_code == 503
    assert "The engine process died" in log


def test_sigterm_drains_requests_in_flight_and_leaves_no_process(tiny_model_dir, launch_server, tmp_path):
    args = [tiny_model_dir, "--max-model-len", "512", "--num-gpu-blocks-override", "256", "--shutdown-timeout", "4"]
    with launch_server(tmp_path, args) as server:
        engine_pid = _engine_pid(server)
        with ThreadPoolExecutor(8) as pool:
            short = [pool.submit(_complete, server.url, 8, i % 2 == 0) for i in range(4)]
            long = [pool.submit(_complete, server.url, 480, i % 2 == 0) for i in range(4)]
            _wait_received(server.url, 8)
            server.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            exit_code = server.process.wait(timeout=30)
            exited_after = time.monotonic() - signalled
            short, long = [f.result() for f in short], [f.result() for f in long]
    assert exit_code in (0, -signal.SIGTERM) and exited_after < 4 + 10
    assert all(r["status"] == 200 and r["error"] is None and r["finish_reason"] == "length" for r in short), short
    assert all(r["status"] in (200, 503, None) for r in long), long  # finished, cut off, or closed
    assert _gone(engine_pid)
    assert "Traceback" not in server.log()


def test_cache_too_small_for_the_load_completes_every_request(tiny_model_dir, launch_server, tmp_path):
    """16 blocks of 16 tokens hold four of these requests at most: the rest wait or are preempted (by
    recompute, the default), and every one still completes."""
    args = [tiny_model_dir, "--max-model-len", "128", "--num-gpu-blocks-override", "16"]
    with launch_server(tmp_path, args) as server:
        with ThreadPoolExecutor(20) as pool:
            results = list(pool.map(lambda i: _complete(server.url, 40, i % 2 == 0, timeout=240), range(20)))
        metrics = httpx.get(f"{server.url}/metrics").text
    assert all(r["status"] == 200 and r["error"] is None and r["finish_reason"] == "length" for r in results), results
    assert _metric(metrics, "vllm:num_preemptions_total") > 0  # the cache really was too small
