"""PrometheusStatLogger: the engine's stats as vLLM's `vllm:*` Prometheus metrics.

Names, types, help texts and buckets are vLLM's, each series labelled `model_name` (the served model name).
The metrics live in prometheus_client's default registry, where the HTTP server's `/metrics` finds them.
Only one engine's metrics can hold those names there: a new logger takes the names over from the previous
one (vLLM does the same), and a logger that is closed gives them back.
"""
from __future__ import annotations

import threading
from collections import Counter as Tally
from typing import Any, Optional

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pagedllm.metrics.loggers import StatLoggerBase
from pagedllm.metrics.stats import Stats, SupportsMetricsInfo

FINISHED_REASON = "finished_reason"
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_TOKENS_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
N_BUCKETS = [1, 2, 5, 10, 20]


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to `max_value`: buckets for token counts bounded by the model length."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


class _Registration:
    """Which logger's collectors hold the `vllm:*` names in each registry."""

    _lock = threading.Lock()
    _owners: dict[int, list[Any]] = {}

    @classmethod
    def take_over(cls, registry: CollectorRegistry, collectors: list[Any]) -> None:
        with cls._lock:
            for collector in cls._owners.get(id(registry), []):
                registry.unregister(collector)
            for collector in collectors:
                registry.register(collector)
            cls._owners[id(registry)] = collectors

    @classmethod
    def add(cls, registry: CollectorRegistry, owned: list[Any], collector: Any) -> None:
        """Register one more collector for the logger that owns `owned`, if it still owns the names."""
        with cls._lock:
            if cls._owners.get(id(registry)) is owned:
                registry.register(collector)
            owned.append(collector)

    @classmethod
    def give_back(cls, registry: CollectorRegistry, collectors: list[Any]) -> None:
        with cls._lock:
            if cls._owners.get(id(registry)) is collectors:
                for collector in collectors:
                    registry.unregister(collector)
                del cls._owners[id(registry)]


class PrometheusStatLogger(StatLoggerBase):
    def __init__(self, local_interval: float, labels: dict[str, str], engine_config: Any,
                 registry: Optional[CollectorRegistry] = None) -> None:
        super().__init__(local_interval, engine_config)
        prometheus_client.disable_created_metrics()
        self.labels = labels
        self.registry = registry if registry is not None else prometheus_client.REGISTRY
        names = list(labels)
        max_len = engine_config.model_config.max_model_len
        self._collectors: list[Any] = []

        def gauge(name: str, doc: str) -> Any:
            return self._own(Gauge(name, doc, names, registry=None)).labels(**labels)

        def counter(name: str, doc: str) -> Any:
            return self._own(Counter(name, doc, names, registry=None)).labels(**labels)

        def histogram(name: str, doc: str, buckets: list) -> Any:
            return self._own(Histogram(name, doc, names, registry=None, buckets=buckets)).labels(**labels)

        self.running = gauge("vllm:num_requests_running", "Number of requests currently running on GPU.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.swapped = gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.")
        self.gpu_cache_usage = gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.")
        self.cpu_cache_usage = gauge("vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.")
        self.gpu_prefix_hit_rate = gauge("vllm:gpu_prefix_cache_hit_rate", "GPU prefix cache block hit rate.")
        self.cpu_prefix_hit_rate = gauge("vllm:cpu_prefix_cache_hit_rate", "CPU prefix cache block hit rate.")
        self.lora_info = self._own(Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                                         ["running_lora_adapters", "max_lora", "waiting_lora_adapters"],
                                         registry=None))
        self.preemptions = counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens_total", "Number of generation tokens processed.")
        self.tokens = counter("vllm:tokens_total", "Number of prefill plus generation tokens processed.")
        self.iteration_tokens = histogram("vllm:iteration_tokens_total",
                                          "Histogram of number of tokens per engine_step.", ITERATION_TOKENS_BUCKETS)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.tpot = histogram("vllm:time_per_output_token_seconds",
                              "Histogram of time per output token in seconds.", TPOT_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of end to end request latency in seconds.", REQUEST_LATENCY_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds",
                                    "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.inference_time = histogram("vllm:request_inference_time_seconds",
                                        "Histogram of time spent in RUNNING phase for request.",
                                        REQUEST_LATENCY_BUCKETS)
        self.prefill_time = histogram("vllm:request_prefill_time_seconds",
                                      "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS)
        self.decode_time = histogram("vllm:request_decode_time_seconds",
                                     "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS)
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                               build_1_2_5_buckets(max_len))
        self.request_generation_tokens = histogram("vllm:request_generation_tokens",
                                                   "Number of generation tokens processed.",
                                                   build_1_2_5_buckets(max_len))
        self.request_max_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
            build_1_2_5_buckets(max_len))
        self.request_n = histogram("vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS)
        self.request_max_tokens = histogram("vllm:request_params_max_tokens",
                                            "Histogram of the max_tokens request parameter.",
                                            build_1_2_5_buckets(max_len))
        self.request_success = self._own(Counter("vllm:request_success_total",
                                                 "Count of successfully processed requests.",
                                                 names + [FINISHED_REASON], registry=None))
        self._success_by_reason: dict[str, Any] = {}
        self.spec_decode = (_SpecDecodeMetrics(self._own, names, labels)
                            if engine_config.speculative_config else None)
        _Registration.take_over(self.registry, self._collectors)

    def _own(self, collector: Any) -> Any:
        self._collectors.append(collector)
        return collector

    def info(self, type: str, obj: SupportsMetricsInfo) -> None:
        """Static information as a gauge set to 1 whose labels carry the values (vLLM's `*_info` gauges)."""
        if type != "cache_config":
            return
        values = obj.metrics_info()
        gauge = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(values),
                      registry=None, multiprocess_mode="mostrecent")
        gauge.labels(**values).set(1)
        _Registration.add(self.registry, self._collectors, gauge)

    def log(self, stats: Stats) -> None:
        self.running.set(stats.num_running_sys)
        self.waiting.set(stats.num_waiting_sys)
        self.swapped.set(stats.num_swapped_sys)
        self.gpu_cache_usage.set(stats.gpu_cache_usage_sys)
        self.cpu_cache_usage.set(stats.cpu_cache_usage_sys)
        self.gpu_prefix_hit_rate.set(stats.gpu_prefix_cache_hit_rate)
        self.cpu_prefix_hit_rate.set(stats.cpu_prefix_cache_hit_rate)
        self.lora_info.labels(running_lora_adapters=",".join(stats.running_lora_adapters), max_lora=stats.max_lora,
                              waiting_lora_adapters=",".join(stats.waiting_lora_adapters)).set_to_current_time()
        self.preemptions.inc(stats.num_preemption_iter)
        self.prompt_tokens.inc(stats.num_prompt_tokens_iter)
        self.generation_tokens.inc(stats.num_generation_tokens_iter)
        self.tokens.inc(stats.num_tokens_iter)
        if stats.num_tokens_iter:
            self.iteration_tokens.observe(stats.num_tokens_iter)
        for histogram, values in (
                (self.ttft, stats.time_to_first_tokens_iter), (self.tpot, stats.time_per_output_tokens_iter),
                (self.e2e, stats.time_e2e_requests), (self.queue_time, stats.time_queue_requests),
                (self.inference_time, stats.time_inference_requests),
                (self.prefill_time, stats.time_prefill_requests), (self.decode_time, stats.time_decode_requests),
                (self.request_prompt_tokens, stats.num_prompt_tokens_requests),
                (self.request_generation_tokens, stats.num_generation_tokens_requests),
                (self.request_max_generation_tokens, stats.max_num_generation_tokens_requests),
                (self.request_n, stats.n_requests), (self.request_max_tokens, stats.max_tokens_requests)):
            for value in values:
                histogram.observe(value)
        for reason, count in Tally(stats.finished_reason_requests).items():
            self._success(reason).inc(count)
        if self.spec_decode is not None and stats.spec_decode_metrics is not None:
            self.spec_decode.log(stats.spec_decode_metrics)

    def _success(self, reason: str) -> Any:
        child = self._success_by_reason.get(reason)
        if child is None:
            child = self._success_by_reason[reason] = self.request_success.labels(
                **self.labels, **{FINISHED_REASON: reason})
        return child

    def close(self) -> None:
        _Registration.give_back(self.registry, self._collectors)


class _SpecDecodeMetrics:
    """Speculative decoding: acceptance as gauges, token counts as counters (the worker reports totals)."""

    def __init__(self, own: Any, names: list[str], labels: dict[str, str]) -> None:
        def metric(cls: type, name: str, doc: str) -> Any:
            return own(cls(name, doc, names, registry=None)).labels(**labels)

        self.acceptance_rate = metric(Gauge, "vllm:spec_decode_draft_acceptance_rate",
                                      "Speulative token acceptance rate.")
        self.efficiency = metric(Gauge, "vllm:spec_decode_efficiency", "Speculative decoding system efficiency.")
        self.counters = {
            "accepted_tokens": metric(Counter, "vllm:spec_decode_num_accepted_tokens_total",
                                      "Number of accepted tokens."),
            "draft_tokens": metric(Counter, "vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens."),
            "emitted_tokens": metric(Counter, "vllm:spec_decode_num_emitted_tokens_total",
                                     "Number of emitted tokens."),
        }
        self.totals = dict.fromkeys(self.counters, 0)

    def log(self, metrics: Any) -> None:
        self.acceptance_rate.set(metrics.draft_acceptance_rate)
        self.efficiency.set(metrics.system_efficiency)
        for name, counter in self.counters.items():
            total = getattr(metrics, name)
            counter.inc(max(0, total - self.totals[name]))
            self.totals[name] = total
