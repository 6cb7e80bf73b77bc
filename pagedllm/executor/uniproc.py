"""The in-process executor: one worker in the engine's own process."""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

from pagedllm.executor.base import ExecutorBase
from pagedllm.worker.worker import Worker


class UniProcExecutor(ExecutorBase):
    def _init_executor(self) -> None:
        self.worker: Optional[Worker] = Worker(self.config, rank=0)
        self.worker.load_model()

    def collective_rpc(self, method: Union[str, Callable], timeout: Optional[float] = None,
                       args: tuple = (), kwargs: Optional[dict] = None) -> list[Any]:
        if self.worker is None:
            raise RuntimeError("The executor has been shut down.")
        kwargs = kwargs or {}
        if isinstance(method, str):
            return [getattr(self.worker, method)(*args, **kwargs)]
        return [method(self.worker, *args, **kwargs)]

    def shutdown(self) -> None:
        self.worker = None
