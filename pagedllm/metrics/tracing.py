"""OpenTelemetry tracing: one `llm_request` span per finished request, sent to an OTLP endpoint.

The span is a child of the trace the client passed in W3C `traceparent`/`tracestate` headers, starts at the
request's arrival and ends when it finished; its `gen_ai.*` attributes come from the request's
`RequestMetrics`, so they equal what the request's `RequestOutput.metrics` shows.
"""
from __future__ import annotations

import logging
import os
from functools import lru_cache
from typing import Any, Mapping

from pagedllm.core.request import Request
from pagedllm.outputs import RequestMetrics

logger = logging.getLogger(__name__)

TRACES_PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
TRACE_HEADERS = ("traceparent", "tracestate")


def extract_trace_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The W3C trace context headers among an HTTP request's headers (matched without regard to case)."""
    return {name.lower(): value for name, value in headers.items() if name.lower() in TRACE_HEADERS}


class SpanAttributes:
    """vLLM's attribute names: OpenTelemetry's gen_ai conventions plus its latency figures."""

    GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
    GEN_AI_REQUEST_ID = "gen_ai.request.id"
    GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
    GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
    GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
    GEN_AI_REQUEST_N = "gen_ai.request.n"
    GEN_AI_USAGE_NUM_SEQUENCES = "gen_ai.usage.num_sequences"
    GEN_AI_USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
    GEN_AI_USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
    GEN_AI_LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
    GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
    GEN_AI_LATENCY_E2E = "gen_ai.latency.e2e"
    GEN_AI_LATENCY_TIME_IN_SCHEDULER = "gen_ai.latency.time_in_scheduler"
    GEN_AI_LATENCY_TIME_IN_MODEL_FORWARD = "gen_ai.latency.time_in_model_forward"
    GEN_AI_LATENCY_TIME_IN_MODEL_EXECUTE = "gen_ai.latency.time_in_model_execute"


def span_exporter(endpoint: str) -> Any:
    """An OTLP span exporter for `endpoint`, over gRPC or HTTP/protobuf as OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
    says (gRPC by default)."""
    protocol = os.environ.get(TRACES_PROTOCOL_ENV, "grpc")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    elif protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    else:
        raise ValueError(f"Unsupported OTLP protocol {protocol!r} in {TRACES_PROTOCOL_ENV}; "
                         "use 'grpc' or 'http/protobuf'.")
    return OTLPSpanExporter(endpoint=endpoint)


@lru_cache(maxsize=None)
def warn_tracing_disabled() -> None:
    """Warn, once per process, that trace context was passed to an engine that does not trace."""
    logger.warning("Received a request with trace context but tracing is disabled; start the engine with "
                   "otlp_traces_endpoint to export its spans.")


class RequestTracer:
    """Owns a tracer provider that batches `llm_request` spans to the OTLP endpoint."""

    def __init__(self, endpoint: str, model: str) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.model = model
        self.provider = TracerProvider(resource=Resource.create({"service.name": "pagedllm"}))
        self.provider.add_span_processor(BatchSpanProcessor(span_exporter(endpoint)))
        self.tracer = self.provider.get_tracer("pagedllm.engine")
        self.propagator = TraceContextTextMapPropagator()

    def add_span_processor(self, processor: Any) -> None:
        """Also hand spans to `processor` (e.g. an in-memory exporter's)."""
        self.provider.add_span_processor(processor)

    def trace(self, request: Request, metrics: RequestMetrics) -> None:
        """Export the span of a finished request, parented on its trace headers if it has any."""
        from opentelemetry.trace import SpanKind

        params = request.sampling_params
        attributes: dict[str, Any] = {
            SpanAttributes.GEN_AI_RESPONSE_MODEL: self.model,
            SpanAttributes.GEN_AI_REQUEST_ID: request.request_id,
            SpanAttributes.GEN_AI_REQUEST_N: getattr(params, "n", 1),  # a pooling request is one sequence
            SpanAttributes.GEN_AI_USAGE_NUM_SEQUENCES: 1,
            SpanAttributes.GEN_AI_USAGE_PROMPT_TOKENS: request.num_prompt_tokens,
            SpanAttributes.GEN_AI_USAGE_COMPLETION_TOKENS: request.num_output_tokens,
            SpanAttributes.GEN_AI_LATENCY_E2E: metrics.finished_time - metrics.arrival_time,
        }
        optional = {  # sampling settings are absent from pooling requests
            SpanAttributes.GEN_AI_REQUEST_TEMPERATURE: getattr(params, "temperature", None),
            SpanAttributes.GEN_AI_REQUEST_TOP_P: getattr(params, "top_p", None),
            SpanAttributes.GEN_AI_REQUEST_MAX_TOKENS: getattr(params, "max_tokens", None),
            SpanAttributes.GEN_AI_LATENCY_TIME_IN_QUEUE: metrics.time_in_queue,
            SpanAttributes.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN:
                None if metrics.first_token_time is None else metrics.first_token_time - metrics.arrival_time,
            SpanAttributes.GEN_AI_LATENCY_TIME_IN_SCHEDULER: metrics.scheduler_time,
            SpanAttributes.GEN_AI_LATENCY_TIME_IN_MODEL_FORWARD:
                None if metrics.model_forward_time is None else metrics.model_forward_time / 1000.0,
            SpanAttributes.GEN_AI_LATENCY_TIME_IN_MODEL_EXECUTE: metrics.model_execute_time,
        }
        attributes.update({name: value for name, value in optional.items() if value is not None})
        context = self.propagator.extract(request.trace_headers) if request.trace_headers else None
        span = self.tracer.start_span("llm_request", context=context, kind=SpanKind.SERVER,
                                      attributes=attributes, start_time=int(metrics.arrival_time * 1e9))
        span.end(end_time=int(metrics.finished_time * 1e9))

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Send the spans still batched; True if all went out."""
        return self.provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.provider.shutdown()
