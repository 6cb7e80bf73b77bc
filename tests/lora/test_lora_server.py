"""LoRA adapters through the OpenAI server and the `openai` client: --lora-modules, /v1/models, a request's
model naming an adapter, unknown names as 404, and loading and unloading at run time."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from pagedllm import LoRARequest, SamplingParams
from pagedllm.entrypoints.openai.launch import launch_server

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server_url(adapters, tmp_path_factory):
    module = json.dumps({"name": "json-adapter", "path": adapters[1]})
    args = ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "2", "--max-model-len", "512",
            "--num-gpu-blocks-override", "128", "--lora-modules", f"first={adapters[0]}", module]
    with launch_server(args, tmp_path_factory.mktemp("lora-server") / "server.log",
                       env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"}) as url:
        yield url


@pytest.fixture(scope="module")
def client(server_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=120)


def complete(client: openai.OpenAI, model: str) -> str:
    return client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text


def test_models_list_the_adapters_with_the_base_model_as_parent(client):
    cards = {card.id: card for card in client.models.list().data}
    base = next(name for name in cards if name not in ("first", "json-adapter"))
    assert cards["first"].parent == base and cards["json-adapter"].parent == base
    assert cards[base].parent is None


def test_a_request_naming_an_adapter_gets_its_answer(client, lora_llm, adapters):
    params = SamplingParams(temperature=0, max_tokens=8)
    expected = lora_llm.generate(PROMPT, params, use_tqdm=False,
                                 lora_request=LoRARequest("adapter0", 1, adapters[0]))[0].outputs[0].text
    base = client.models.list().data[0].id
    assert complete(client, "first") == expected
    assert complete(client, base) != expected
    chat = client.chat.completions.create(model="json-adapter", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=4, temperature=0)
    assert chat.model == "json-adapter" and chat.choices[0].message.content


def test_unknown_model_is_404_in_openai_shape(client):
    with pytest.raises(openai.NotFoundError) as error:
        complete(client, "no-such-adapter")
    body = error.value.body  # the `error` object of OpenAI's error shape
    assert body["code"] == 404 and body["param"] == "model" and "no-such-adapter" in body["message"]


def test_load_and_unload_at_run_time(client, server_url, adapters):
    loaded = httpx.post(f"{server_url}/v1/load_lora_adapter", json={"lora_name": "late", "lora_path": adapters[2]},
                        timeout=120)
    assert loaded.status_code == 200, loaded.text
    assert "late" in {card.id for card in client.models.list().data}
    assert complete(client, "late")
    bad = httpx.post(f"{server_url}/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": "/nowhere"},
                     timeout=120)
    assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"]
    assert httpx.post(f"{server_url}/v1/unload_lora_adapter", json={"lora_name": "late"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        complete(client, "late")
    assert httpx.post(f"{server_url}/v1/unload_lora_adapter", json={"lora_name": "late"}).status_code == 404
