"""Observability: per-step stats, stat loggers (log lines, Prometheus), request tracing, profiling."""
from pagedllm.metrics.loggers import LoggingStatLogger, StatLoggerBase
from pagedllm.metrics.stats import CacheMetricsInfo, Stats, SupportsMetricsInfo

__all__ = ["CacheMetricsInfo", "LoggingStatLogger", "StatLoggerBase", "Stats", "SupportsMetricsInfo"]
