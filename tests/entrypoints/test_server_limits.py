"""The server's limits, on the app in process over the tiny model: a full waiting queue is a 503 with
Retry-After, a request past the timeout a 504, and tokenizing runs off the event loop."""
from __future__ import annotations

import argparse
import asyncio
import threading
import time

import httpx
import pytest

from pagedllm import AsyncEngineArgs, AsyncLLMEngine
from pagedllm.entrypoints.openai.api_server import build_app
from pagedllm.entrypoints.openai.cli_args import add_server_args

LONG = {"prompt": "Hello", "max_tokens": 400, "ignore_eos": True}


def _app(tiny_model_dir: str, flags: list[str]):
    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=tiny_model_dir, num_gpu_blocks_override=64,
                                                             max_num_seqs=2, max_model_len=512))
    return build_app(engine, add_server_args(argparse.ArgumentParser()).parse_args(flags))


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=120)


def test_full_waiting_queue_is_503_with_retry_after(tiny_model_dir):
    async def run():
        app = await _app(tiny_model_dir, ["--max-waiting-requests", "1"])
        async with _client(app) as client:
            admitted = [asyncio.ensure_future(client.post("/v1/completions", json=LONG)) for _ in range(3)]
            while app.state.completion.context.admission.in_flight < 3:
                await asyncio.sleep(0.01)
            refused = await client.post("/v1/completions", json=LONG)
            finished = await asyncio.gather(*admitted)
            after = await client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2})
        return refused, finished, after, app.state.completion.context.admission.in_flight

    refused, finished, after, in_flight = asyncio.run(run())
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
    assert refused.json()["error"]["type"] == "ServiceUnavailableError"
    assert [r.status_code for r in finished] == [200] * 3 and after.status_code == 200
    assert in_flight == 0


def test_request_past_the_timeout_is_504_and_aborted(tiny_model_dir):
    async def run():
        app = await _app(tiny_model_dir, ["--request-timeout", "0.5"])
        async with _client(app) as client:
            started = time.monotonic()
            late = await client.post("/v1/completions", json={**LONG, "max_tokens": 500})
            waited = time.monotonic() - started
            while app.state.engine.engine.has_unfinished_requests() and time.monotonic() - started < 10:
                await asyncio.sleep(0.05)
            return late, waited, app.state.engine.engine.has_unfinished_requests()

    late, waited, unfinished = asyncio.run(run())
    assert late.status_code == 504 and "timeout" in late.json()["error"]["message"]
    assert waited < 5 and not unfinished


@pytest.mark.parametrize("route, body", [("/tokenize", {"prompt": "slow"}),
                                         ("/v1/completions", {"prompt": "slow", "max_tokens": 2})])
def test_tokenizing_does_not_block_the_event_loop(tiny_model_dir, route, body):
    async def run():
        app = await _app(tiny_model_dir, [])
        tokenizer = app.state.tokenization.tokenizer
        real_encode = tokenizer.encode
        encoding = threading.Event()

        def slow_encode(text, **kwargs):
            encoding.set()
            time.sleep(1.0)  # a huge prompt
            return real_encode(text, **kwargs)

        tokenizer.encode = slow_encode
        try:
            async with _client(app) as client:
                slow = asyncio.ensure_future(client.post(route, json=body))
                while not encoding.is_set():
                    await asyncio.sleep(0.005)
                started = time.monotonic()
                health = await client.get("/health")
                health_s = time.monotonic() - started
                return (await slow).status_code, health.status_code, health_s
        finally:
            tokenizer.encode = real_encode

    slow_status, health_status, health_s = asyncio.run(run())
    assert slow_status == 200 and health_status == 200
    assert health_s < 0.5
