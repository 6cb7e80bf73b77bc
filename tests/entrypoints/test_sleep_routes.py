"""Sleep mode over HTTP: /sleep, /wake_up and /is_sleeping exist only with VLLM_SERVER_DEV_MODE=1, as in vLLM."""
from __future__ import annotations

import time

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow


def _complete(client: openai.OpenAI) -> list[int]:
    response = client.completions.create(model=client.models.list().data[0].id, prompt="Hello, my name is",
                                         max_tokens=6, temperature=0, logprobs=0)
    return response.choices[0].logprobs.tokens


def test_sleep_and_wake_up_over_http(launch_server, tiny_model_dir, tmp_path):
    args = [tiny_model_dir, "--enable-sleep-mode", "--max-model-len", "128",
            "--num-gpu-blocks-override", "64"]
    with launch_server(tmp_path, args, {"VLLM_SERVER_DEV_MODE": "1"}) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        before = _complete(client)
        assert httpx.post(f"{server.url}/sleep", params={"level": 1}).status_code == 200
        assert httpx.get(f"{server.url}/is_sleeping").json() == {"is_sleeping": True}
        with pytest.raises(openai.APIStatusError) as refused:
            _complete(client)
        assert refused.value.status_code == 503 and "sleeping" in refused.value.message
        tags = [("tags", "weights"), ("tags", "kv_cache")]
        assert httpx.post(f"{server.url}/wake_up", params=tags).status_code == 200
        assert httpx.get(f"{server.url}/is_sleeping").json() == {"is_sleeping": False}
        assert _complete(client) == before
        _assert_refusals(server.url, client)
        assert _complete(client) == before


def _error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    return response.json()["error"]["message"]


def _assert_refusals(url: str, client: openai.OpenAI) -> None:
    """Bad values are 400s naming them; sleeping with a request in flight, or twice, is a 409 (a conflict with
    the engine's state, not a server error)."""
    assert "level" in _error(httpx.post(f"{url}/sleep", params={"level": 3}), 400)
    assert "tags" in _error(httpx.post(f"{url}/wake_up", params={"tags": "everything"}), 400)
    stream = client.completions.create(model=client.models.list().data[0].id, prompt="Hello", max_tokens=100,
                                       extra_body={"ignore_eos": True}, stream=True)
    next(iter(stream))  # the request is running
    assert "unfinished request" in _error(httpx.post(f"{url}/sleep"), 409)
    stream.close()
    for _ in range(100):  # the engine aborts the closed stream's request within a step or two
        response = httpx.post(f"{url}/sleep")
        if response.status_code != 409:
            break
        time.sleep(0.1)
    assert response.status_code == 200
    assert "already sleeping" in _error(httpx.post(f"{url}/sleep"), 409)
    assert httpx.post(f"{url}/wake_up").status_code == 200


def test_the_routes_are_absent_without_dev_mode(tiny_server):
    assert httpx.post(f"{tiny_server.url}/sleep").status_code == 404
    assert httpx.get(f"{tiny_server.url}/is_sleeping").status_code == 404
