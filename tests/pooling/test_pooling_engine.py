"""LLMEngine with pooling requests: add_request with PoolingParams, step() returning PoolingRequestOutput, and the
requests counted in the stats like any others."""
from __future__ import annotations

import pytest
import torch

from pagedllm import EngineArgs, LLMEngine, PoolingParams, PoolingRequestOutput
from pagedllm.metrics import Stats
from pagedllm.metrics.loggers import StatLoggerBase


class Recorder(StatLoggerBase):
    def __init__(self) -> None:
        super().__init__(local_interval=0)
        self.stats: list[Stats] = []

    def log(self, stats: Stats) -> None:
        self.stats.append(stats)

    def info(self, type: str, obj) -> None:
        pass


def test_step_returns_pooling_outputs_and_counts_them():
    recorder = Recorder()
    engine = LLMEngine.from_engine_args(EngineArgs(task="embed", disable_log_stats=False, max_num_seqs=2),
                                        stat_loggers={"recorder": recorder})
    prompts = {"a": "The first text.", "b": "A second, slightly longer text to embed.", "c": "Third."}
    for request_id, text in prompts.items():
        engine.add_request(request_id, text, PoolingParams())
    steps = []
    while engine.has_unfinished_requests():
        steps.append(engine.step())
    # max_num_seqs=2: two requests in the first step, the third in the next; each finishes in its one pass.
    assert [sorted(o.request_id for o in step) for step in steps] == [["a", "b"], ["c"]]
    outputs = {o.request_id: o for step in steps for o in step}
    assert all(isinstance(o, PoolingRequestOutput) and o.finished for o in outputs.values())
    assert all(o.outputs.data.shape == (384,) for o in outputs.values())
    assert abs(torch.linalg.norm(outputs["a"].outputs.data).item() - 1.0) < 1e-5
    lengths = [len(outputs[rid].prompt_token_ids) for rid in prompts]
    assert lengths == [len(engine.get_tokenizer().encode(text)) for text in prompts.values()]
    assert sum(s.num_prompt_tokens_iter for s in recorder.stats) == sum(lengths)
    assert sum(s.num_generation_tokens_iter for s in recorder.stats) == 0
    assert sorted(n for s in recorder.stats for n in s.num_prompt_tokens_requests) == sorted(lengths)
    assert [r for s in recorder.stats for r in s.finished_reason_requests] == ["stop"] * 3
    e2e = [t for s in recorder.stats for t in s.time_e2e_requests]
    assert len(e2e) == 3 and all(t > 0 for t in e2e)
    metrics = outputs["c"].metrics
    assert metrics.finished_time >= metrics.first_scheduled_time >= metrics.arrival_time
    assert engine.scheduler.kv_cache.usage == 0.0  # the bookkeeping blocks are all back


def test_pooling_requests_are_traced(otlp_collector):
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    collector = otlp_collector("grpc")
    engine = LLMEngine.from_engine_args(EngineArgs(task="embed", otlp_traces_endpoint=collector.endpoint))
    memory = InMemorySpanExporter()
    engine.tracer.add_span_processor(SimpleSpanProcessor(memory))
    engine.add_request("traced", {"prompt_token_ids": [101, 7592, 2088, 102]}, PoolingParams())
    while engine.has_unfinished_requests():
        engine.step()
    (span,) = memory.get_finished_spans()
    assert span.attributes["gen_ai.request.id"] == "traced"
    assert span.attributes["gen_ai.usage.prompt_tokens"] == 4
    assert span.attributes["gen_ai.usage.completion_tokens"] == 0
    assert "gen_ai.request.temperature" not in span.attributes


def test_async_engine_encode_yields_one_final_output():
    import asyncio

    from pagedllm import AsyncEngineArgs, AsyncLLMEngine

    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(task="embed"))

    async def encode() -> list:
        return [output async for output in engine.encode("An asynchronous text.", PoolingParams(), "async-1")]

    try:
        (output,) = asyncio.run(encode())
    finally:
        engine.shutdown()
    assert output.finished and output.request_id == "async-1" and output.outputs.data.shape == (384,)
