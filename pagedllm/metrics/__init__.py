"""Observability: per-step stats, stat loggers (log lines, Prometheus), request tracing."""
from pagedllm.metrics.loggers import LoggingStatLogger, StatLoggerBase
from pagedllm.metrics.prometheus import PrometheusStatLogger
from pagedllm.metrics.stats import CacheMetricsInfo, Stats, SupportsMetricsInfo

__all__ = ["CacheMetricsInfo", "LoggingStatLogger", "PrometheusStatLogger", "StatLoggerBase", "Stats",
           "SupportsMetricsInfo"]
