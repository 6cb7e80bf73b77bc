"""/metrics and request tracing through a real `pagedllm serve` process on the tiny model."""
from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow

SERVED = "tiny-served"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN_ID = "b7ad6b7169203331"
HEADERS = {"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"}
N, P, G = 3, 6, 4


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_and_traces_through_the_server(tiny_model_dir, launch_server, otlp_collector, tmp_path):
    collector = otlp_collector("http/protobuf")
    env = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    args = [tiny_model_dir, "--served-model-name", SERVED, "--num-gpu-blocks-override", "64",
            "--otlp-traces-endpoint", collector.endpoint]
    with launch_server(tmp_path, args, env) as server, httpx.Client(base_url=server.url, timeout=120) as http:
        usages = []
        for i in range(N):
            body = {"model": SERVED, "prompt": list(range(100 + i, 100 + i + P)), "max_tokens": G,
                    "ignore_eos": True, "request_id": f"c{i}"}
            response = http.post("/v1/completions", json=body, headers=HEADERS if i == 0 else {})
            usages.append(response.json()["usage"])
        chat = {"model": SERVED, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": G,
                "ignore_eos": True, "request_id": "chat"}
        usages.append(http.post("/v1/chat/completions", json=chat, headers=HEADERS).json()["usage"])
        samples = _samples(http.get("/metrics").text)
        deadline = time.monotonic() + 60
        while len(collector.spans) < len(usages) and time.monotonic() < deadline:
            time.sleep(0.2)
    requests = len(usages)
    assert [u["completion_tokens"] for u in usages] == [G] * requests

    def value(name: str, **labels: str) -> float:
        return samples[(name, frozenset({"model_name": SERVED, **labels}.items()))]

    assert value("vllm:prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert value("vllm:generation_tokens_total") == requests * G
    assert value("vllm:time_to_first_token_seconds_count") == requests
    assert value("vllm:time_per_output_token_seconds_count") == requests * (G - 1)
    assert value("vllm:e2e_request_latency_seconds_count") == requests
    assert value("vllm:request_success_total", finished_reason="length") == requests
    assert value("vllm:num_requests_running") == 0

    attributes = collector.attributes
    spans = {attributes(s)["gen_ai.request.id"]: s for s in collector.spans}
    assert sorted(spans) == ["chatcmpl-chat", "cmpl-c0-0", "cmpl-c1-0", "cmpl-c2-0"]
    for request_id in ("cmpl-c0-0", "chatcmpl-chat"):
        span = spans[request_id]
        assert (span.trace_id.hex(), span.parent_span_id.hex()) == (TRACE_ID, PARENT_SPAN_ID)
    assert spans["cmpl-c1-0"].trace_id.hex() != TRACE_ID
    chat_span = attributes(spans["chatcmpl-chat"])
    assert (chat_span["gen_ai.usage.prompt_tokens"], chat_span["gen_ai.usage.completion_tokens"]) == (
        usages[-1]["prompt_tokens"], G)
