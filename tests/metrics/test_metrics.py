"""Prometheus metrics, the stats log line and RequestMetrics, checked after known traffic on the tiny model."""
from __future__ import annotations

import dataclasses
import logging
import re
import time
import types

import pytest
from prometheus_client import REGISTRY

from pagedllm import LLM, SamplingParams
from pagedllm.metrics import LoggingStatLogger, Stats
from pagedllm.metrics.prometheus import build_1_2_5_buckets

N, P, G = 4, 9, 5
MODEL_NAME = "tiny-metrics"


def _prompts(n: int, length: int) -> list[dict]:
    return [{"prompt_token_ids": list(range(100 + 7 * i, 100 + 7 * i + length))} for i in range(n)]


def _value(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, {"model_name": MODEL_NAME, **labels})
    assert value is not None, f"{name} {labels} is not exported"
    return value


@pytest.fixture(scope="module")
def stats_llm(tiny_model_dir):
    llm = LLM(tiny_model_dir, num_gpu_blocks_override=64, disable_log_stats=False, served_model_name=MODEL_NAME)
    yield llm
    del llm


def test_counts_are_exact_after_known_traffic(stats_llm):
    before = {name: _value(name) for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")}
    assert before == {"vllm:prompt_tokens_total": 0.0, "vllm:generation_tokens_total": 0.0}
    outputs = stats_llm.generate(_prompts(N, P), SamplingParams(max_tokens=G, ignore_eos=True), use_tqdm=False)
    # Greedy decoding is deterministic: stopping on its third token makes both requests finish with "stop".
    greedy = SamplingParams(temperature=0, max_tokens=G, ignore_eos=True)
    first = stats_llm.generate(_prompts(1, P), greedy, use_tqdm=False)[0].outputs[0].token_ids
    stopped = stats_llm.generate(_prompts(1, P) * 2, SamplingParams(temperature=0, max_tokens=G,
                                                                   stop_token_ids=[first[2]]), use_tqdm=False)
    assert [o.outputs[0].finish_reason for o in stopped] == ["stop", "stop"]

    requests = N + 3
    prompt_tokens = requests * P
    generated = N * G + G + sum(len(o.outputs[0].token_ids) for o in stopped)
    assert _value("vllm:prompt_tokens_total") == prompt_tokens
    assert _value("vllm:generation_tokens_total") == generated
    assert _value("vllm:tokens_total") == prompt_tokens + generated
    assert _value("vllm:iteration_tokens_total_sum") == prompt_tokens + generated
    assert _value("vllm:time_to_first_token_seconds_count") == requests
    assert _value("vllm:time_per_output_token_seconds_count") == generated - requests
    assert _value("vllm:e2e_request_latency_seconds_count") == requests
    for name in ("queue_time", "inference_time", "prefill_time", "decode_time"):
        assert _value(f"vllm:request_{name}_seconds_count") == requests
    assert _value("vllm:request_success_total", finished_reason="length") == N + 1
    assert _value("vllm:request_success_total", finished_reason="stop") == 2
    assert _value("vllm:request_prompt_tokens_sum") == prompt_tokens
    assert _value("vllm:request_generation_tokens_sum") == generated
    assert _value("vllm:request_max_num_generation_tokens_sum") == generated
    assert _value("vllm:request_params_max_tokens_sum") == requests * G
    assert _value("vllm:request_params_n_sum") == requests
    assert _value("vllm:request_params_n_bucket", le="1.0") == requests
    assert _value("vllm:num_preemptions_total") == 0
    # Nothing is left running or holding cache blocks.
    assert _value("vllm:num_requests_running") == 0
    assert _value("vllm:num_requests_waiting") == 0
    assert _value("vllm:gpu_cache_usage_perc") == 0
    # The latency histograms hold the very figures of the requests' RequestMetrics.
    e2e = sum(o.metrics.finished_time - o.metrics.arrival_time for o in outputs)
    ttft = sum(o.metrics.first_token_time - o.metrics.arrival_time for o in outputs)
    assert _value("vllm:e2e_request_latency_seconds_sum") >= e2e > 0
    assert _value("vllm:time_to_first_token_seconds_sum") >= ttft > 0


def test_buckets_are_vllms(stats_llm):
    max_len = stats_llm.llm_engine.model_config.max_model_len
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    for le in build_1_2_5_buckets(max_len):
        assert REGISTRY.get_sample_value("vllm:request_prompt_tokens_bucket",
                                         {"model_name": MODEL_NAME, "le": str(float(le))}) is not None
    assert _value("vllm:time_to_first_token_seconds_bucket", le="2560.0") >= 0
    assert _value("vllm:e2e_request_latency_seconds_bucket", le="7680.0") >= 0
    assert _value("vllm:iteration_tokens_total_bucket", le="16384.0") >= 0


def test_cache_config_info_carries_the_cache_settings(stats_llm):
    cache = stats_llm.llm_engine.get_cache_config()
    labels = {"block_size": str(cache.block_size), "num_gpu_blocks": "64", "num_gpu_blocks_override": "64",
              "enable_prefix_caching": str(cache.enable_prefix_caching), "swap_space": str(cache.swap_space),
              "gpu_memory_utilization": str(cache.gpu_memory_utilization), "cache_dtype": cache.cache_dtype,
              "kv_cache_memory": str(cache.kv_cache_memory), "num_cpu_blocks": "0"}
    assert REGISTRY.get_sample_value("vllm:cache_config_info", labels) == 1.0


def test_log_line_has_the_right_figures(stats_llm, caplog):
    engine = stats_llm.llm_engine
    engine.remove_logger("logging")  # only the test's logger writes lines
    with pytest.raises(KeyError):
        engine.remove_logger("logging")
    stat_logger = LoggingStatLogger(local_interval=3600.0)
    engine.add_logger("test-line", stat_logger)
    with pytest.raises(KeyError):
        engine.add_logger("test-line", stat_logger)
    caplog.set_level(logging.INFO, logger="pagedllm.metrics.loggers")
    original, engine.scheduler.config = engine.scheduler.config, dataclasses.replace(
        engine.scheduler.config, max_num_seqs=2)
    try:
        for i, prompt in enumerate(_prompts(N, P)):
            engine.add_request(f"line-{i}", prompt, SamplingParams(max_tokens=G, ignore_eos=True))
        start = stat_logger.last_local_log = time.time()
        engine.step()  # two requests prefill and sample their first token; two wait
        stat_logger.local_interval = 0.0
        before = time.time()
        engine.do_log_stats()
        after = time.time()
    finally:
        engine.remove_logger("test-line")
        engine.abort_request([f"line-{i}" for i in range(N)])
        engine.scheduler.config = original
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Avg prompt throughput")]
    assert len(lines) == 1
    figures = [float(x) for x in re.findall(r"(\d+(?:\.\d+)?)(?: tokens/s| reqs|%)", lines[0])]
    prompt_tp, gen_tp, running, swapped, pending, kv_usage, swap_usage = figures
    hit_rates = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Prefix cache hit rate")]
    assert hit_rates == ["Prefix cache hit rate: GPU: 0.00%, CPU: 0.00%"]
    assert 2 * P / (after - start) - 0.05 <= prompt_tp <= 2 * P / (before - start) + 0.05
    assert 2 / (after - start) - 0.05 <= gen_tp <= 2 / (before - start) + 0.05
    assert (running, swapped, pending) == (2, 0, N - 2)
    assert kv_usage == round(100 * 2 / 64, 1)  # one block each for the two running requests
    assert swap_usage == 0.0


def test_log_line_every_interval():
    stat_logger = LoggingStatLogger(local_interval=5.0)
    stat_logger.last_local_log = 1000.0
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    log = logging.getLogger("pagedllm.metrics.loggers")
    log.addHandler(handler)
    old_level, log.level = log.level, logging.INFO
    try:
        stat_logger.log(Stats(now=1003.0, num_prompt_tokens_iter=30, num_generation_tokens_iter=4))
        assert records == []
        stat_logger.log(Stats(now=1005.5, num_prompt_tokens_iter=25, num_generation_tokens_iter=7,
                              num_running_sys=3, num_waiting_sys=1, gpu_cache_usage_sys=0.25,
                              gpu_prefix_cache_hit_rate=0.5))
    finally:
        log.removeHandler(handler)
        log.level = old_level
    # vLLM's wording, which users grep for.
    assert records == ["Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 2.0 tokens/s, "
                       "Running: 3 reqs, Swapped: 0 reqs, Pending: 1 reqs, GPU KV cache usage: 25.0%, "
                       "CPU KV cache usage: 0.0%.", "Prefix cache hit rate: GPU: 50.00%, CPU: 0.00%"]
    assert stat_logger.last_local_log == 1005.5 and stat_logger.num_prompt_tokens == []


def test_idle_lines_go_to_debug_and_no_hit_rate_without_prefix_caching(caplog):
    config = types.SimpleNamespace(cache_config=types.SimpleNamespace(enable_prefix_caching=False))
    stat_logger = LoggingStatLogger(local_interval=5.0, engine_config=config)
    stat_logger.last_local_log = 1000.0
    caplog.set_level(logging.DEBUG, logger="pagedllm.metrics.loggers")
    for now, tokens in ((1006.0, 12), (1012.0, 0), (1018.0, 0)):
        stat_logger.log(Stats(now=now, num_prompt_tokens_iter=tokens))
    levels = [r.levelname for r in caplog.records if r.getMessage().startswith("Avg prompt throughput")]
    assert levels == ["INFO", "INFO", "DEBUG"]  # the first idle line still shows the drop to zero
    assert not [r for r in caplog.records if "Prefix cache hit rate" in r.getMessage()]


def test_request_metrics_filled_with_stats_off(tiny_model_dir):
    llm = LLM(tiny_model_dir, num_gpu_blocks_override=64)
    outputs = llm.generate(_prompts(3, P), SamplingParams(max_tokens=G, ignore_eos=True), use_tqdm=False)
    for output in outputs:
        m = output.metrics
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.last_token_time
        assert m.last_token_time <= m.finished_time
        assert m.time_in_queue == m.first_scheduled_time - m.arrival_time
        assert m.scheduler_time > 0 and m.model_execute_time > 0
        # model_forward_time is in milliseconds, like vLLM's; the forward pass is part of the execution.
        assert 0 < m.model_forward_time / 1000 <= m.model_execute_time
    with pytest.raises(RuntimeError, match="Stat logging is disabled"):
        llm.llm_engine.add_logger("x", LoggingStatLogger(5.0))


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemptions_counted_and_counts_stay_exact(tiny_model_dir, mode):
    # 4 blocks of 16 tokens: three requests of 16 + 20 tokens cannot all keep their blocks.
    llm = LLM(tiny_model_dir, num_gpu_blocks_override=4, disable_log_stats=False, served_model_name=MODEL_NAME,
              preemption_mode=mode, swap_space=0.01)
    n, p, g = 3, 16, 20
    llm.generate(_prompts(n, p), SamplingParams(max_tokens=g, ignore_eos=True), use_tqdm=False)
    preemptions = llm.llm_engine.scheduler.num_preemptions
    assert preemptions > 0
    assert _value("vllm:num_preemptions_total") == preemptions
    assert _value("vllm:prompt_tokens_total") == n * p
    assert _value("vllm:generation_tokens_total") == n * g
    assert _value("vllm:time_per_output_token_seconds_count") == n * (g - 1)
    assert _value("vllm:request_success_total", finished_reason="length") == n


def test_new_engine_takes_over_the_names_and_closing_gives_them_back(tiny_model_dir):
    first = LLM(tiny_model_dir, num_gpu_blocks_override=64, disable_log_stats=False, served_model_name="first")
    first.generate(_prompts(1, P), SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    assert REGISTRY.get_sample_value("vllm:prompt_tokens_total", {"model_name": "first"}) == P
    second = LLM(tiny_model_dir, num_gpu_blocks_override=64, disable_log_stats=False, served_model_name="second")
    assert REGISTRY.get_sample_value("vllm:prompt_tokens_total", {"model_name": "first"}) is None
    assert REGISTRY.get_sample_value("vllm:prompt_tokens_total", {"model_name": "second"}) == 0
    second.llm_engine.remove_logger("prometheus")
    assert REGISTRY.get_sample_value("vllm:prompt_tokens_total", {"model_name": "second"}) is None
    del first, second


def test_prefix_cache_hit_rate_is_exported_and_logged(tiny_model_dir, caplog):
    llm = LLM(tiny_model_dir, num_gpu_blocks_override=64, enable_prefix_caching=True, disable_log_stats=False,
              served_model_name=MODEL_NAME)
    prompt = _prompts(1, 40)
    llm.generate(prompt, SamplingParams(max_tokens=2), use_tqdm=False)
    llm.llm_engine.remove_logger("logging")
    llm.llm_engine.add_logger("every-step", LoggingStatLogger(local_interval=0.0))
    caplog.set_level(logging.INFO, logger="pagedllm.metrics.loggers")
    llm.generate(prompt, SamplingParams(max_tokens=2), use_tqdm=False)
    stats = llm.llm_engine.scheduler.kv_cache.prefix_cache_stats
    assert stats.hits > 0
    assert _value("vllm:gpu_prefix_cache_hit_rate") == stats.hit_rate
    last = [r.getMessage() for r in caplog.records if "Prefix cache hit rate" in r.getMessage()][-1]
    assert last == f"Prefix cache hit rate: GPU: {100 * stats.hit_rate:.2f}%, CPU: 0.00%"
