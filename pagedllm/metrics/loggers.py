"""Stat loggers: what the engine hands its `Stats` to after every step."""
from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from typing import Any

from pagedllm.metrics.stats import Stats, SupportsMetricsInfo

logger = logging.getLogger(__name__)

LOCAL_LOGGING_INTERVAL_SEC = 5.0


class StatLoggerBase(ABC):
    """Receives the engine's `Stats` once per step (and on `do_log_stats()`); may keep what it needs."""

    def __init__(self, local_interval: float, engine_config: Any = None) -> None:
        self.local_interval = local_interval
        self.engine_config = engine_config
        self.last_local_log = time.time()
        self.num_prompt_tokens: list[int] = []
        self.num_generation_tokens: list[int] = []

    @abstractmethod
    def log(self, stats: Stats) -> None:
        """Take one step's stats; called on the engine's thread, so keep it cheap."""

    @abstractmethod
    def info(self, type: str, obj: SupportsMetricsInfo) -> None:
        """Take static information (e.g. type "cache_config") once, when the engine starts."""

    def close(self) -> None:
        """Release what the logger holds (called when it is removed or the engine goes away)."""


class LoggingStatLogger(StatLoggerBase):
    """Every `local_interval` seconds, vLLM's INFO lines (DEBUG while idle, so an idle server stays quiet):
    throughputs since the last line, queues and cache use, then the prefix cache hit rate when caching is on."""

    def __init__(self, local_interval: float, engine_config: Any = None) -> None:
        super().__init__(local_interval, engine_config)
        self.last_prompt_throughput = 0.0
        self.last_generation_throughput = 0.0

    def log(self, stats: Stats) -> None:
        self.num_prompt_tokens.append(stats.num_prompt_tokens_iter)
        self.num_generation_tokens.append(stats.num_generation_tokens_iter)
        elapsed = stats.now - self.last_local_log
        if elapsed <= self.local_interval:
            return
        prompt_throughput = sum(self.num_prompt_tokens) / elapsed
        generation_throughput = sum(self.num_generation_tokens) / elapsed
        log = logger.info if any((prompt_throughput, generation_throughput, self.last_prompt_throughput,
                                  self.last_generation_throughput)) else logger.debug
        log("Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, "
            "Swapped: %d reqs, Pending: %d reqs, GPU KV cache usage: %.1f%%, CPU KV cache usage: %.1f%%.",
            prompt_throughput, generation_throughput, stats.num_running_sys, stats.num_swapped_sys,
            stats.num_waiting_sys, stats.gpu_cache_usage_sys * 100, stats.cpu_cache_usage_sys * 100)
        if self.engine_config is None or self.engine_config.cache_config.enable_prefix_caching:
            log("Prefix cache hit rate: GPU: %.2f%%, CPU: %.2f%%", stats.gpu_prefix_cache_hit_rate * 100,
                stats.cpu_prefix_cache_hit_rate * 100)
        if stats.spec_decode_metrics is not None:
            log("Speculative metrics: %s", stats.spec_decode_metrics)
        self.num_prompt_tokens, self.num_generation_tokens = [], []
        self.last_local_log = stats.now
        self.last_prompt_throughput, self.last_generation_throughput = prompt_throughput, generation_throughput

    def info(self, type: str, obj: SupportsMetricsInfo) -> None:
        if type == "cache_config":
            logger.debug("Cache config: %s", obj.metrics_info())
