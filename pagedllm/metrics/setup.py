"""What an engine starts with: its default stat loggers and, with an OTLP endpoint, its request tracer."""
from __future__ import annotations

from typing import Optional

from pagedllm.config import EngineConfig
from pagedllm.metrics.loggers import LOCAL_LOGGING_INTERVAL_SEC, LoggingStatLogger, StatLoggerBase
from pagedllm.metrics.stats import CacheMetricsInfo
from pagedllm.metrics.tracing import RequestTracer


def default_stat_loggers(config: EngineConfig, num_gpu_blocks: int) -> dict[str, StatLoggerBase]:
    """A log line every 5 s and the Prometheus metrics, labelled with the served model name."""
    from pagedllm.metrics.prometheus import PrometheusStatLogger

    loggers: dict[str, StatLoggerBase] = {
        "logging": LoggingStatLogger(LOCAL_LOGGING_INTERVAL_SEC, config),
        "prometheus": PrometheusStatLogger(LOCAL_LOGGING_INTERVAL_SEC,
                                           {"model_name": config.model_config.served_model_name}, config),
    }
    cache_info = CacheMetricsInfo(config.cache_config, num_gpu_blocks)
    for stat_logger in loggers.values():
        stat_logger.info("cache_config", cache_info)
    return loggers


def request_tracer(config: EngineConfig) -> Optional[RequestTracer]:
    endpoint = config.observability_config.otlp_traces_endpoint
    return RequestTracer(endpoint, config.model_config.model) if endpoint else None
