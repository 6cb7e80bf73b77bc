"""Executors: how the engine reaches the workers that run the model."""
from __future__ import annotations

from typing import Any

from pagedllm.config import EngineConfig
from pagedllm.executor.base import ExecutorBase


def executor_class(config: EngineConfig) -> type[ExecutorBase]:
    backend: Any = config.parallel_config.distributed_executor_backend
    if isinstance(backend, type):
        return backend
    if backend == "uni":
        from pagedllm.executor.uniproc import UniProcExecutor

        return UniProcExecutor
    if backend == "mp":
        from pagedllm.executor.multiproc import MultiprocExecutor

        return MultiprocExecutor
    raise ValueError(f"distributed_executor_backend {backend!r} is not available in this build; use 'uni' or 'mp'.")


__all__ = ["ExecutorBase", "executor_class"]
