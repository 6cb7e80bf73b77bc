"""Tracing: `llm_request` spans received by a real OTLP collector (gRPC and HTTP) started by the test."""
from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pagedllm import LLM, SamplingParams
from pagedllm.metrics.tracing import extract_trace_headers, warn_tracing_disabled

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
HEADERS = {"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"}


def _run(engine, requests: dict[str, tuple[list[int], SamplingParams, dict | None]]) -> dict:
    for request_id, (token_ids, params, headers) in requests.items():
        engine.add_request(request_id, {"prompt_token_ids": token_ids}, params, trace_headers=headers)
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
    return finished


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_spans_reach_a_real_otlp_collector(tiny_model_dir, monkeypatch, otlp_collector, protocol):
    collector = otlp_collector(protocol)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", protocol)
    llm = LLM(tiny_model_dir, num_gpu_blocks_override=64, otlp_traces_endpoint=collector.endpoint)
    engine = llm.llm_engine
    memory = InMemorySpanExporter()
    engine.tracer.add_span_processor(SimpleSpanProcessor(memory))
    outputs = _run(engine, {
        "traced": (list(range(200, 211)), SamplingParams(temperature=0.7, top_p=0.9, max_tokens=6,
                                                         ignore_eos=True, seed=1), HEADERS),
        "untraced": (list(range(300, 305)), SamplingParams(max_tokens=3, ignore_eos=True), None),
    })
    assert engine.tracer.force_flush()
    attributes = collector.attributes
    spans = {attributes(s)["gen_ai.request.id"]: s for s in collector.spans}
    assert sorted(spans) == ["traced", "untraced"]
    assert {s.name for s in spans.values()} == {"llm_request"}
    assert len(memory.get_finished_spans()) == 2

    span, output = spans["traced"], outputs["traced"]
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PARENT_SPAN_ID
    assert spans["untraced"].trace_id.hex() != TRACE_ID and not spans["untraced"].parent_span_id
    m = output.metrics
    assert span.start_time_unix_nano == int(m.arrival_time * 1e9)
    assert span.end_time_unix_nano == int(m.finished_time * 1e9)
    assert attributes(span) == {
        "gen_ai.response.model": tiny_model_dir,
        "gen_ai.request.id": "traced",
        "gen_ai.request.temperature": 0.7,
        "gen_ai.request.top_p": 0.9,
        "gen_ai.request.max_tokens": 6,
        "gen_ai.request.n": 1,
        "gen_ai.usage.num_sequences": 1,
        "gen_ai.usage.prompt_tokens": len(output.prompt_token_ids),
        "gen_ai.usage.completion_tokens": len(output.outputs[0].token_ids),
        "gen_ai.latency.time_in_queue": m.time_in_queue,
        "gen_ai.latency.time_to_first_token": m.first_token_time - m.arrival_time,
        "gen_ai.latency.e2e": m.finished_time - m.arrival_time,
        "gen_ai.latency.time_in_scheduler": m.scheduler_time,
        "gen_ai.latency.time_in_model_forward": m.model_forward_time / 1000.0,
        "gen_ai.latency.time_in_model_execute": m.model_execute_time,
    }
    memory_span = next(s for s in memory.get_finished_spans() if s.attributes["gen_ai.request.id"] == "traced")
    assert dict(memory_span.attributes) == attributes(span)


def test_trace_headers_without_tracing_warn_once(tiny_model_dir, caplog):
    warn_tracing_disabled.cache_clear()
    llm = LLM(tiny_model_dir, num_gpu_blocks_override=64)
    caplog.set_level(logging.WARNING, logger="pagedllm.metrics.tracing")
    outputs = _run(llm.llm_engine, {
        f"r{i}": (list(range(100, 104)), SamplingParams(max_tokens=2, ignore_eos=True), HEADERS) for i in range(2)})
    assert len(outputs) == 2
    warnings = [r for r in caplog.records if "tracing is disabled" in r.getMessage()]
    assert len(warnings) == 1


def test_unknown_otlp_protocol_is_a_clear_error(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "carrier-pigeon")
    with pytest.raises(ValueError, match="carrier-pigeon"):
        LLM(tiny_model_dir, num_gpu_blocks_override=64, otlp_traces_endpoint="http://127.0.0.1:1")


def test_extract_trace_headers_keeps_only_w3c_context():
    headers = {"Traceparent": HEADERS["traceparent"], "tracestate": "k=v", "Authorization": "secret"}
    assert extract_trace_headers(headers) == {"traceparent": HEADERS["traceparent"], "tracestate": "k=v"}
