"""Hostile but well-formed HTTP requests get an OpenAI-style 400 naming the field, and the server keeps
serving after each: nothing a request carries may reach the engine unchecked."""
from __future__ import annotations

import json
import re

import httpx
import pytest

pytestmark = pytest.mark.slow

VOCAB_PLUS = 10**12
MESSAGES = [{"role": "user", "content": "Hi"}]
# Where a server's internals would show: source files, module paths, tracebacks.
INTERNALS = re.compile(r"Traceback|\.py\b|\.cc\b|/site-packages/|/project/|pagedllm\.")


def _completion(**fields) -> tuple[str, dict]:
    return "/v1/completions", {"prompt": "Hello", "max_tokens": 2, **fields}


def _chat(**fields) -> tuple[str, dict]:
    return "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, **fields}


# (route and body, the field the error must name)
CASES = {
    # integers beyond int64, where the engine stores them (the seed as vLLM bounds it)
    "seed 2**64": (_completion(seed=2**64), "seed"),
    "seed below int64": (_completion(seed=-(2**63) - 1), "seed"),
    "top_k 2**70": (_completion(top_k=2**70), "top_k"),
    "priority 2**70": (_completion(priority=2**70), "priority"),
    "min_tokens 2**70": (_completion(min_tokens=2**70), "min_tokens"),
    "max_tokens 2**64": (_completion(max_tokens=2**64), "max_tokens"),
    "logprobs 2**64": (_completion(logprobs=2**64), "logprobs"),
    "truncate_prompt_tokens 2**64": (_completion(truncate_prompt_tokens=2**64), "truncate_prompt_tokens"),
    "chat max_completion_tokens -1": (_chat(max_completion_tokens=-1), "max_completion_tokens"),
    # token ids the engine would index its tensors with
    "stop_token_ids out of vocab": (_completion(stop_token_ids=[VOCAB_PLUS], min_tokens=1), "stop_token_ids"),
    "stop_token_ids negative": (_completion(stop_token_ids=[-1]), "stop_token_ids"),
    "allowed_token_ids negative": (_completion(allowed_token_ids=[-5]), "allowed_token_ids"),
    "prompt token beyond int64": (_completion(prompt=[2**64]), "prompt"),
    "detokenize beyond int64": (("/detokenize", {"tokens": [2**70]}), "tokens"),
    # counts and nesting
    "n 10**6": (_completion(n=10**6), "n"),
    "best_of 10**6": (_completion(best_of=10**6), "best_of"),
    "best_of above n when streaming": (_completion(best_of=3, n=1, temperature=1, stream=True), "best_of"),
    "too many prompts": (_completion(prompt=["a"] * 10_000), "prompt"),
    "too many stop strings": (_completion(stop=["x"] * 5_000), "stop"),
    "prompts times n beyond capacity": (_completion(prompt=["a"] * 200, n=100), "n"),
    "no messages": (_chat(messages=[]), "messages"),
    # sizes
    "request id of 10,000 characters": (_completion(request_id="r" * 10_000), "request_id"),
    "prompt longer than any context": (_completion(prompt="word " * 40_000), "prompt"),
    # templates run on the server
    "request chat template": (_chat(chat_template="{{ 'x' * 10 }}"), "chat_template"),
    "chat_template_kwargs overriding tokenize": (_chat(chat_template_kwargs={"tokenize": True}),
                                                 "chat_template_kwargs"),
    # wrong types
    "seed as text": (_completion(seed="abc"), "seed"),
    "temperature as a list": (_completion(temperature=[1]), "temperature"),
}


def _post(server, path: str, body: dict | str) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(f"{server.url}{path}", content=content, timeout=60,
                      headers={"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"})


def _still_serving(server) -> None:
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    response = _post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 1, "seed": 1})
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] >= 1


def _assert_bad_request(response: httpx.Response, field: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert field in (error["param"] or "") and field in error["message"]
    assert not INTERNALS.search(error["message"]), error["message"]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_out_of_range_fields_are_400s_naming_the_field(tiny_server, case):
    (path, body), field = case
    _assert_bad_request(_post(tiny_server, path, body), field)
    _still_serving(tiny_server)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_floats_are_refused(tiny_server, literal):
    """Python's JSON parser accepts NaN and Infinity, which would reach the sampler as they are."""
    body = '{"prompt": "Hello", "max_tokens": 2, "temperature": %s}' % literal
    _assert_bad_request(_post(tiny_server, "/v1/completions", body), "temperature")
    _still_serving(tiny_server)


def test_deeply_nested_json_is_refused(tiny_server):
    body = '{"prompt": "Hello", "guided_json": ' + "[" * 100_000 + "]" * 100_000 + "}"
    response = _post(tiny_server, "/v1/completions", body)
    assert response.status_code == 400 and not INTERNALS.search(response.text)
    _still_serving(tiny_server)


@pytest.mark.parametrize("fields", [{"guided_regex": "(unclosed"}, {"guided_grammar": "root ::= ("},
                                    {"guided_json": {"type": "nonsense"}}])
def test_grammar_errors_are_400s_without_internals(tiny_server, fields):
    path, body = _completion(**fields)
    response = _post(tiny_server, path, body)
    assert response.status_code == 400
    assert not INTERNALS.search(response.json()["error"]["message"]), response.text
    _still_serving(tiny_server)


def test_oversized_body_is_413_before_parsing(tiny_server):
    response = _post(tiny_server, "/v1/completions", {"prompt": "x" * (tiny_server.max_body_bytes + 1)})
    assert response.status_code == 413 and response.json()["error"]["code"] == 413
    _still_serving(tiny_server)


def test_every_v1_route_needs_the_key(tiny_server):
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                         ("GET", "/v1/no-such-route")):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {tiny_server.api_key}x"}):
            response = httpx.request(method, f"{tiny_server.url}{path}", headers=headers, json={})
            assert response.status_code == 401, (method, path, headers)
    assert httpx.get(f"{tiny_server.url}/health").status_code == 200  # open, as vLLM leaves it
