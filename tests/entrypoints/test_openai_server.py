"""The OpenAI-compatible server as users run it: a real `pagedllm serve` process and the official client."""
from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow

PROMPT = "The best way to learn a new language is"
MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def _http(server) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.api_key}"}, timeout=120)


def test_models_version_health_tokenize(server, client, model):
    models = client.models.list().data
    assert [m.id for m in models] == [model] and model
    with _http(server) as http:
        assert http.get("/health").status_code == 200
        assert http.get("/version").json()["version"]
        tokens = http.post("/tokenize", json={"prompt": PROMPT}).json()
        assert tokens["count"] == len(tokens["tokens"]) > 3
        assert http.post("/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"] == PROMPT
        assert http.get("/metrics").status_code == 200


def test_completion_and_chat(server, client, model):
    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
    choice = completion.choices[0]
    assert choice.text and choice.finish_reason in ("length", "stop")
    with _http(server) as http:
        prompt_tokens = http.post("/tokenize", json={"prompt": PROMPT}).json()["count"]
    assert completion.usage.prompt_tokens == prompt_tokens
    assert 0 < completion.usage.completion_tokens <= 12
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=16, temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens


def test_streamed_equals_non_streamed(client, model):
    kwargs = dict(model=model, prompt=PROMPT, max_tokens=16, temperature=0)
    whole = client.completions.create(**kwargs).choices[0]
    pieces = list(client.completions.create(stream=True, **kwargs))
    assert "".join(p.choices[0].text for p in pieces if p.choices) == whole.text
    assert [p.choices[0].finish_reason for p in pieces if p.choices][-1] == whole.finish_reason
    chat_kwargs = dict(model=model, messages=MESSAGES, max_tokens=16, temperature=0)
    reply = client.chat.completions.create(**chat_kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, **chat_kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reply


def test_final_usage_chunk(client, model):
    kwargs = dict(model=model, prompt=PROMPT, max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    usage = client.completions.create(**kwargs).usage
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].usage.model_dump() == usage.model_dump()
    assert usage.completion_tokens == 10
    chat = list(client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=5, stream=True,
                                               stream_options={"include_usage": True},
                                               extra_body={"ignore_eos": True}))
    assert chat[-1].choices == [] and chat[-1].usage.completion_tokens == 5


def test_n2_with_logprobs(client, model):
    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, n=2, temperature=1.0,
                                           seed=7, logprobs=3, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in completion.choices) == [0, 1]
    for choice in completion.choices:
        logprobs = choice.logprobs
        assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 8
        assert "".join(logprobs.tokens) == choice.text
        assert all(lp <= 0 for lp in logprobs.token_logprobs)
        assert all(3 <= len(top) <= 4 for top in logprobs.top_logprobs)
    assert completion.usage.completion_tokens == 16
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6, n=2, temperature=1.0,
                                          logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in chat.choices) == [0, 1]
    for choice in chat.choices:
        content = choice.logprobs.content
        assert len(content) == 6 and all(len(t.top_logprobs) == 2 for t in content)
        assert all(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob for t in content)
        assert "".join(t.token for t in content) == choice.message.content


def test_echo_stop_seed_and_vllm_extras(client, model):
    echoed = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0, echo=True)
    assert echoed.choices[0].text.startswith(PROMPT) and len(echoed.choices[0].text) > len(PROMPT)
    free = client.completions.create(model=model, prompt=PROMPT, max_tokens=16, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = free.strip()[-3:]
    stopped = client.completions.create(model=model, prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop],
                                        extra_body={"ignore_eos": True}).choices[0]
    assert stopped.finish_reason == "stop" and stop not in stopped.text and free.startswith(stopped.text)
    seeded = [client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=123,
                                        extra_body={"top_k": 50, "min_p": 0.01, "repetition_penalty": 1.1,
                                                    "min_tokens": 8}).choices[0].text for _ in range(2)]
    assert seeded[0] == seeded[1]
    kept = client.completions.create(model=model, prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop],
                                     extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
    assert kept.choices[0].text == stopped.text + stop


def test_guided_decoding(client, model):
    choices = ["apple pie", "banana", "cherry tart"]
    picked = client.completions.create(model=model, prompt="My favourite dessert is", max_tokens=10,
                                       temperature=1.0, seed=3, extra_body={"guided_choice": choices})
    assert picked.choices[0].text in choices
    schema = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["age"]}
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "How old is the moon? Answer in JSON."}], max_tokens=30,
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "age", "schema": schema}})
    value = json.loads(reply.choices[0].message.content)
    assert set(value) == {"age"} and 0 <= value["age"] <= 120
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt="x", extra_body={"guided_regex": "(unclosed"})


def test_64_concurrent_requests_complete(server, model):
    async def run():
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=server.api_key,
                                      max_retries=0, timeout=300) as aclient:
            return await asyncio.gather(*(
                aclient.completions.create(model=model, prompt=f"Request {i}: {PROMPT}", max_tokens=6,
                                           temperature=0, extra_body={"ignore_eos": True}) for i in range(64)))

    results = asyncio.run(run())
    assert len(results) == 64
    assert all(r.usage.completion_tokens == 6 and r.choices[0].finish_reason == "length" for r in results)
    assert len({r.id for r in results}) == 64


@pytest.mark.parametrize("kwargs, status, message", [
    (dict(temperature=-1.0), 400, "temperature"),
    (dict(top_p=0.0), 400, "top_p"),
    (dict(max_tokens=0), 400, "max_tokens"),
    (dict(max_tokens=100_000), 400, "maximum context length"),
    (dict(n=0), 400, "n must be at least 1"),
    (dict(logprobs=50), 400, "logprobs"),
    (dict(prompt=[10**9]), 400, "out of vocabulary"),
    (dict(prompt=[]), 400, "empty"),
    (dict(extra_body={"min_tokens": 20}, max_tokens=10), 400, "min_tokens"),
    (dict(extra_body={"guided_regex": "a+", "guided_choice": ["a"]}), 400, "one kind of guided decoding"),
    (dict(max_tokens="many"), 400, "max_tokens"),
    (dict(model="no-such-model"), 404, "does not exist"),
])
def test_bad_requests_get_openai_errors(client, model, kwargs, status, message):
    arguments = {"model": model, "prompt": PROMPT, **kwargs}
    with pytest.raises(openai.APIStatusError) as raised:
        client.completions.create(**arguments)
    error = raised.value
    assert error.status_code == status
    assert message in error.body["message"]
    assert error.body["code"] == status and error.body["type"].endswith("Error")


def test_bad_chat_and_stream_requests(client, model):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model, messages=MESSAGES, top_logprobs=3)
    assert "logprobs" in raised.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=MESSAGES, temperature=5.0, top_p=2.0)
    with pytest.raises(openai.BadRequestError) as raised:  # a streamed bad request fails before streaming
        client.completions.create(model=model, prompt=[10**9], stream=True)
    assert "out of vocabulary" in raised.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": [{"type": "image_url"}]}])


def test_auth_body_limit_and_malformed_json(server, model):
    for key in (None, "wrong-key"):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        response = httpx.post(f"{server.url}/v1/completions", json={"model": model, "prompt": "x"},
                              headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()
    with _http(server) as http:
        big = http.post("/v1/completions", json={"model": model, "prompt": "x" * (server.max_body_bytes + 10)})
        assert big.status_code == 413 and big.json()["error"]["code"] == 413
        malformed = http.post("/v1/completions", content=b"{not json",
                              headers={"Content-Type": "application/json"})
        assert malformed.status_code == 400 and malformed.json()["error"]["type"] == "BadRequestError"


def _aborted(server, engine_request_id: str, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if f"Aborted request {engine_request_id}." in server.log():
            return True
        time.sleep(0.1)
    return False


def _running_gauge(server) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    return float(re.search(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", text, re.MULTILINE).group(1))


def test_disconnected_clients_abort_their_requests(server, model):
    body = {"model": model, "prompt": PROMPT, "max_tokens": 4000, "ignore_eos": True, "stream": True,
            "request_id": "gone-stream"}
    with _http(server) as http:
        with http.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            first = json.loads(next(line for line in lines if line.startswith("data: "))[len("data: "):])
            assert first["id"] == "cmpl-gone-stream"
            assert _running_gauge(server) >= 1
    assert _aborted(server, "cmpl-gone-stream-0")
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server.url}/v1/chat/completions", timeout=1.5,
                   headers={"Authorization": f"Bearer {server.api_key}"},
                   json={"model": model, "messages": MESSAGES, "max_tokens": 4000, "ignore_eos": True,
                         "request_id": "gone-whole"})
    assert _aborted(server, "chatcmpl-gone-whole")
    deadline = time.monotonic() + 10
    while _running_gauge(server) != 0.0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _running_gauge(server) == 0.0


def test_server_stays_healthy(server, client, model):
    assert httpx.get(f"{server.url}/health").status_code == 200
    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0)
    assert completion.choices[0].text
    assert "Traceback" not in server.log()
