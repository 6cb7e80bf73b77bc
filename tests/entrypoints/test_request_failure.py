"""A request that fails on its own while its batch runs gets an error over HTTP (500 with why, or an error
event in its stream) and the server goes on serving (the app in process, tiny model). The server's own failures
are injected where the workers report them; a request whose parameters together leave no token to sample
(min_tokens barring the only tokens allowed) fails on its own with a 400 that names them."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json

import httpx

from pagedllm import AsyncEngineArgs, AsyncLLMEngine
from pagedllm.entrypoints.openai.api_server import build_app
from pagedllm.entrypoints.openai.cli_args import add_server_args

DOOMED_MAX_TOKENS = 7  # the requests asking for this many tokens fail in the workers


def _failing_requests_with_7_max_tokens(executor) -> None:
    real_execute = executor.execute_model
    doomed: dict[str, int] = {}  # request id -> tokens sampled so far; it fails at its third

    def execute(scheduler_output):
        doomed.update({r.request_id: 0 for r in scheduler_output.new_requests
                       if r.sampling_params.max_tokens == DOOMED_MAX_TOKENS})
        output = real_execute(scheduler_output)
        for rid in doomed.keys() & output.sampled_token_ids.keys():
            doomed[rid] += 1
        failed = {rid: "its logits processor raised ValueError: injected" for rid in output.sampled_token_ids
                  if doomed.get(rid) == 3}
        sampled = {rid: t for rid, t in output.sampled_token_ids.items() if rid not in failed}
        return dataclasses.replace(output, sampled_token_ids=sampled, failed=failed)

    executor.execute_model = execute


def test_a_failing_request_gets_an_error_and_the_server_goes_on(tiny_model_dir):
    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=tiny_model_dir, num_gpu_blocks_override=32))
    _failing_requests_with_7_max_tokens(engine.engine.model_executor)
    args = add_server_args(argparse.ArgumentParser()).parse_args([])

    async def run():
        app = await build_app(engine, args)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as client:
            def complete(max_tokens: int, stream: bool = False):
                return client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": max_tokens,
                                                            "temperature": 0, "stream": stream})
            good, bad, bad_stream = await asyncio.gather(complete(12), complete(DOOMED_MAX_TOKENS),
                                                         complete(DOOMED_MAX_TOKENS, stream=True))
            later = await complete(12)
            health = await client.get("/health")
        return good, bad, bad_stream, later, health

    good, bad, bad_stream, later, health = asyncio.run(run())
    assert good.status_code == 200 and later.status_code == 200 and health.status_code == 200
    assert good.json()["choices"][0]["text"] == later.json()["choices"][0]["text"]
    assert bad.status_code == 500 and "logits processor raised ValueError: injected" in bad.json()["error"]["message"]
    # The stream had begun: its chunks so far, then an error event, then [DONE].
    events = [line[len("data: "):] for line in bad_stream.text.splitlines() if line.startswith("data: ")]
    assert bad_stream.status_code == 200 and json.loads(events[0])["choices"][0]["text"]
    assert events[-1] == "[DONE]" and "injected" in json.loads(events[-2])["error"]["message"]
    assert not engine.errored
    engine.shutdown()


def test_parameters_that_leave_no_token_are_a_client_error(tiny_model_dir, tokenizer):
    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=tiny_model_dir, num_gpu_blocks_override=32))
    args = add_server_args(argparse.ArgumentParser()).parse_args([])
    # Only EOS is allowed, and min_tokens bars it: the first step has nothing to sample.
    impossible = {"prompt": "Hello", "max_tokens": 8, "min_tokens": 3, "allowed_token_ids": [tokenizer.eos_token_id]}

    async def run():
        app = await build_app(engine, args)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as client:
            bad = await client.post("/v1/completions", json=impossible)
            bad_stream = await client.post("/v1/completions", json={**impossible, "stream": True})
            # The guided choice ends after a few tokens, short of min_tokens: the stream has begun by then.
            ended = await client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 30, "min_tokens": 20,
                                                               "guided_choice": ["Hello world"], "stream": True})
            good = await client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 4})
        return bad, bad_stream, ended, good

    bad, bad_stream, ended, good = asyncio.run(run())
    error = bad.json()["error"]
    assert bad.status_code == 400 and error["type"] == "BadRequestError"
    assert "allowed_token_ids, min_tokens=3" in error["message"] and "no token to sample" in error["message"]
    # It failed at its first token, before its stream began: the same answer as a plain request's.
    assert bad_stream.status_code == 400 and bad_stream.json()["error"]["message"].endswith(error["message"][-60:])
    events = [line[len("data: "):] for line in ended.text.splitlines() if line.startswith("data: ")]
    assert ended.status_code == 200 and events[-1] == "[DONE]" and json.loads(events[0])["choices"][0]["text"]
    error = json.loads(events[-2])["error"]
    assert error["code"] == 400 and "guided_decoding, min_tokens=20" in error["message"]
    assert good.status_code == 200 and not engine.errored
    engine.shutdown()
