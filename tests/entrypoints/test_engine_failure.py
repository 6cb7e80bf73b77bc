"""When the engine loop fails, requests get 503 and /health reports it (the app in process, tiny model)."""
from __future__ import annotations

import argparse
import asyncio

import httpx

from pagedllm import AsyncEngineArgs, AsyncLLMEngine
from pagedllm.entrypoints.openai.api_server import build_app
from pagedllm.entrypoints.openai.cli_args import add_server_args


def test_failed_engine_loop_reports_503_and_unhealthy(tiny_model_dir):
    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=tiny_model_dir, num_gpu_blocks_override=32))
    args = add_server_args(argparse.ArgumentParser()).parse_args([])
    executor = engine.engine.model_executor

    def lost_worker(scheduler_output):
        raise RuntimeError("worker lost")

    async def run():
        app = await build_app(engine, args)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            healthy = await client.get("/health")
            ok = await client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3})
            executor.execute_model = lost_worker
            failed = await client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3})
            health = await client.get("/health")
        return healthy, ok, failed, health

    healthy, ok, failed, health = asyncio.run(run())
    assert healthy.status_code == 200 and ok.status_code == 200
    assert failed.status_code == 503 and "worker lost" in failed.json()["error"]["message"]
    assert health.status_code == 503 and health.json()["error"]["type"] == "ServiceUnavailableError"
