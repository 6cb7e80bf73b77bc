"""Sleep mode over HTTP: /sleep, /wake_up and /is_sleeping exist only with VLLM_SERVER_DEV_MODE=1, as in vLLM."""
from __future__ import annotations

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


def test_the_routes_are_absent_without_dev_mode(tiny_server):
    assert httpx.post(f"{tiny_server.url}/sleep").status_code == 404
    assert httpx.get(f"{tiny_server.url}/is_sleeping").status_code == 404
