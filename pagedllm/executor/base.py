"""The seam between the engine and the workers that hold the model.

An executor owns one or more workers (in process, in worker processes, on Ray actors) and offers the
engine a few calls; every call is a `collective_rpc` of a worker method, so a new executor only has to
say how to reach its workers.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Optional, Union

from pagedllm.core.runner_output import ModelRunnerOutput
from pagedllm.core.scheduler_output import SchedulerOutput

from pagedllm.config import EngineConfig


class ExecutorBase(ABC):
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._init_executor()

    @abstractmethod
    def _init_executor(self) -> None:
        """Start the workers and load the model on each."""

    @abstractmethod
    def collective_rpc(self, method: Union[str, Callable], timeout: Optional[float] = None,
                       args: tuple = (), kwargs: Optional[dict] = None) -> list[Any]:
        """Call `method` (a worker method name, or a function taking the worker first) on every worker;
        return their results in rank order."""

    @property
    def output_rank(self) -> int:
        """The worker whose result is the step's: tensor-parallel rank 0 of the last pipeline stage."""
        parallel = self.config.parallel_config
        return (parallel.pipeline_parallel_size - 1) * parallel.tensor_parallel_size

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step on the workers and wait for its output."""
        return self.collective_rpc("execute_model", args=(scheduler_output,))[self.output_rank]

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> Callable[[], ModelRunnerOutput]:
        """Start one step on the workers; the returned function waits for its output. The engine starts a
        step for each virtual engine before it waits for any, so that pipeline stages work on different
        batches at once; executors that cannot send without waiting (this default) run the step here."""
        output = self.execute_model(scheduler_output)
        return lambda: output

    def determine_num_available_blocks(self) -> int:
        return min(self.collective_rpc("determine_num_available_blocks"))

    def initialize_cache(self, num_blocks: int) -> None:
        self.collective_rpc("initialize_cache", args=(num_blocks,))

    def sleep(self, level: int) -> None:
        self.collective_rpc("sleep", args=(level,))

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        self.collective_rpc("wake_up", args=(tags,))

    def start_profile(self) -> None:
        self.collective_rpc("start_profile")

    def stop_profile(self) -> None:
        self.collective_rpc("stop_profile")

    def check_health(self) -> None:
        """Raise if a worker is unusable."""
        self.collective_rpc("check_health")

    def shutdown(self) -> None:
        """Release the workers; safe to call more than once."""
