"""The `mp` executor: each worker in a process of its own, on this machine.

Every call goes to all workers at once (one pickling, one pipe write each), then the replies are gathered
in rank order; a worker that dies is noticed as soon as its process ends, and a hung call after `timeout`.
After a worker fails, the executor stops them all: the engine's state no longer matches theirs.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, Iterator, Optional, Union

from pagedllm.core.runner_output import ModelRunnerOutput
from pagedllm.core.scheduler_output import SchedulerOutput
from pagedllm.distributed.process_groups import free_port
from pagedllm.executor.base import ExecutorBase
from pagedllm.executor.worker_process import WorkerDiedError, WorkerProcess, encode_call, gather_replies


class MultiprocExecutor(ExecutorBase):
    def _init_executor(self) -> None:
        world_size = self.config.parallel_config.world_size
        address = f"tcp://127.0.0.1:{free_port()}" if world_size > 1 else None
        worker_config = self.config.for_worker_processes()
        self.workers = [WorkerProcess(worker_config, rank, address) for rank in range(world_size)]
        self._failure: Optional[BaseException] = None
        self._finalizer = weakref.finalize(self, _stop_all, self.workers)
        self.collective_rpc("load_model")

    def collective_rpc(self, method: Union[str, Callable], timeout: Optional[float] = None,
                       args: tuple = (), kwargs: Optional[dict] = None) -> list[Any]:
        self._check_usable()
        self._send(method, args, kwargs or {})
        return self._gather(method if isinstance(method, str) else getattr(method, "__name__", repr(method)), timeout)

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> Callable[[], ModelRunnerOutput]:
        self._check_usable()
        self._send("execute_model", (scheduler_output,), {})
        return lambda: self._gather("execute_model", None)[self.output_rank]

    def _send(self, method: Union[str, Callable], args: tuple, kwargs: dict) -> None:
        message = encode_call(method, args, kwargs)
        with self._failing():
            for worker in self.workers:
                worker.send(message)

    def _gather(self, method: str, timeout: Optional[float]) -> list[Any]:
        """Each worker's reply to its oldest unanswered call (a worker answers its calls in order)."""
        with self._failing():
            return gather_replies(self.workers, method, timeout)

    @contextlib.contextmanager
    def _failing(self) -> Iterator[None]:
        """A worker that died, failed or hung makes the executor unusable: stop them all."""
        try:
            yield
        except (WorkerDiedError, TimeoutError) as error:
            self._failure = error
            self.shutdown()
            raise

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise WorkerDiedError(f"The executor's workers have failed: {self._failure}")
        if not self._finalizer.alive:
            raise RuntimeError("The executor has been shut down.")

    def check_health(self) -> None:
        self._check_usable()
        for worker in self.workers:
            if not worker.is_alive():
                self._failure = worker.death_error()
                self.shutdown()
                raise self._failure
        super().check_health()

    def shutdown(self) -> None:
        self._finalizer()


def _stop_all(workers: list[WorkerProcess]) -> None:
    for worker in workers:
        worker.stop()
