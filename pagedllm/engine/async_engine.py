"""AsyncLLMEngine: an LLMEngine behind asyncio, stepped by a background task while there is work.

The engine itself is not thread-safe, so only the one step thread touches it. The event loop never waits
for a step: `generate()` and `abort()` queue a command that the step thread applies before its next step,
and a request the engine refuses ends its stream with the error. Each request has a queue its `generate()`
consumer reads from.
"""
from __future__ import annotations

import asyncio
import collections
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, Iterable, Mapping, NamedTuple, Optional, Union

from pagedllm.config import AsyncEngineArgs, ModelConfig
from pagedllm.engine.engine_compat import UsageContext
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.engine.pooling import PoolingClientMixin
from pagedllm.engine.request_streams import (AsyncEngineDeadError, RequestFailedError, RequestParametersError,
                                             RequestStreams, stream_outputs)
from pagedllm.inputs import PromptType
from pagedllm.outputs import RequestOutput
from pagedllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

__all__ = ["AsyncEngineDeadError", "AsyncLLMEngine", "RequestFailedError", "RequestParametersError"]


@dataclass
class _Add:
    request_id: str
    prompt: PromptType
    params: SamplingParams
    kwargs: dict[str, Any]


@dataclass
class _Abort:
    request_ids: list[str]
    done: Optional[asyncio.Future] = field(default=None, repr=False)


class _Turn(NamedTuple):
    """What one turn of the step thread did: its outputs, the requests it refused, the aborts it applied."""

    outputs: list[RequestOutput]
    rejected: list[tuple[str, Exception]]
    aborts: list[_Abort]
    idle: bool


class AsyncLLMEngine(PoolingClientMixin):
    """`generate()` is an async generator of `RequestOutput`s; closing or cancelling it aborts the request."""

    def __init__(self, engine: LLMEngine, log_requests: bool = True, start_engine_loop: bool = True) -> None:
        self.engine = engine
        self.log_requests = log_requests
        self.start_engine_loop = start_engine_loop
        self._streams = RequestStreams()
        self._commands: collections.deque[Union[_Add, _Abort]] = collections.deque()  # appends are thread-safe
        self._step_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagedllm-step")
        self._loop_task: Optional[asyncio.Task] = None
        self._has_work: Optional[asyncio.Event] = None
        self._dead_error: Optional[AsyncEngineDeadError] = None

    @classmethod
    def from_engine_args(cls, engine_args: AsyncEngineArgs, start_engine_loop: bool = True,
                         usage_context: UsageContext = UsageContext.ENGINE_CONTEXT,
                         stat_loggers: Optional[dict[str, Any]] = None) -> "AsyncLLMEngine":
        log_requests = not getattr(engine_args, "disable_log_requests", False)
        return cls(LLMEngine.from_engine_args(engine_args, usage_context, stat_loggers), log_requests,
                   start_engine_loop)

    # --- state --------------------------------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        return self._loop_task is not None and not self._loop_task.done()

    @property
    def errored(self) -> bool:
        return self._dead_error is not None

    @property
    def dead_error(self) -> Optional[BaseException]:
        return self._dead_error

    async def check_health(self) -> None:
        """Raise AsyncEngineDeadError if the loop failed, or the executor's error if a worker is unusable."""
        if self._dead_error is not None:
            raise self._dead_error
        self.engine.check_health()

    async def get_tokenizer(self, lora_request: Any = None) -> Any:
        return self.engine.get_tokenizer()

    async def get_model_config(self) -> ModelConfig:
        return self.engine.get_model_config()

    async def get_scheduler_config(self) -> Any:
        return self.engine.get_scheduler_config()

    async def get_default_sampling_params(self) -> SamplingParams:
        return self.engine.get_default_sampling_params()

    async def is_tracing_enabled(self) -> bool:
        return self.engine.is_tracing_enabled()

    async def do_log_stats(self, scheduler_outputs: Any = None, model_output: Any = None) -> None:
        self.engine.do_log_stats()

    async def start_profile(self) -> None:
        self.engine.start_profile()

    async def sleep(self, level: int = 1) -> None:
        """Sleep mode (LLMEngine.sleep), in the step thread so that it never overlaps a step."""
        await asyncio.get_running_loop().run_in_executor(self._step_thread, self.engine.sleep, level)

    async def wake_up(self, tags: Optional[list[str]] = None) -> None:
        await asyncio.get_running_loop().run_in_executor(self._step_thread, self.engine.wake_up, tags)

    async def is_sleeping(self) -> bool:
        return self.engine.is_sleeping()

    async def stop_profile(self) -> None:
        self.engine.stop_profile()

    # LoRA adapters: run on the step thread, between two steps.
    async def add_lora(self, lora_request: Any) -> bool:
        return await self._between_steps(self.engine.add_lora, lora_request)

    async def remove_lora(self, lora_id: int) -> bool:
        return await self._between_steps(self.engine.remove_lora, lora_id)

    async def list_loras(self) -> set[int]:
        return await self._between_steps(self.engine.list_loras)

    async def _between_steps(self, call: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._step_thread, call, *args)

    # --- the background loop ------------------------------------------------------------------------------

    def start_background_loop(self) -> None:
        """Start stepping the engine on the running event loop."""
        if self._dead_error is not None:
            raise self._dead_error
        if self.is_running:
            raise RuntimeError("Background loop is already running.")
        self._has_work = asyncio.Event()  # events belong to one event loop; a new loop gets a new one
        self._loop_task = asyncio.get_running_loop().create_task(self._run_loop(), name="pagedllm-engine-loop")

    def shutdown_background_loop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            self._loop_task = None

    def shutdown(self) -> None:
        self.shutdown_background_loop()

    async def _run_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._has_work.clear()  # a command queued from now on sets it again
                turn = await loop.run_in_executor(self._step_thread, self._engine_turn)
                self._deliver(turn)
                if turn.idle:
                    await self._has_work.wait()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the engine's state is unknown now: fail everything in flight
            self._fail_all(error)

    def _engine_turn(self) -> _Turn:
        """In the step thread: apply the queued commands, then step once if there is work."""
        rejected: list[tuple[str, Exception]] = []
        aborts: list[_Abort] = []
        while self._commands:
            command = self._commands.popleft()
            if isinstance(command, _Abort):
                self.engine.abort_request(command.request_ids)
                aborts.append(command)
                continue
            try:
                self.engine.add_request(command.request_id, command.prompt, command.params, **command.kwargs)
            except Exception as error:  # a request the engine refuses fails alone
                rejected.append((command.request_id, error))
        if aborts:
            self.engine.do_log_stats()  # the loop may go idle now: let the gauges see the aborts
        if not self.engine.has_unfinished_requests():
            return _Turn([], rejected, aborts, idle=True)
        return _Turn(self.engine.step(), rejected, aborts, idle=False)

    def _deliver(self, turn: _Turn) -> None:
        for request_id, error in turn.rejected:
            self._streams.put(request_id, error)
        for abort in turn.aborts:
            for request_id in abort.request_ids:
                self._streams.put(request_id, asyncio.CancelledError(f"Request {request_id} was aborted."))
                if self.log_requests:
                    logger.info("Aborted request %s.", request_id)
            if abort.done is not None and not abort.done.done():
                abort.done.set_result(None)
        for output in turn.outputs:
            self._streams.put(output.request_id, output)

    def _fail_all(self, error: Exception) -> None:
        logger.error("Engine loop failed; failing %d request(s) in flight.", len(self._streams), exc_info=error)
        dead = AsyncEngineDeadError(
            f"The engine loop failed with {type(error).__name__}: {error}. The engine serves no more "
            "requests; restart it.")
        dead.__cause__ = error
        self._dead_error = dead
        self._streams.fail_all(dead)

    def _submit(self, command: Union[_Add, _Abort]) -> None:
        self._commands.append(command)
        if self._has_work is not None:
            self._has_work.set()

    # --- requests -----------------------------------------------------------------------------------------

    async def generate(self, prompt: PromptType, sampling_params: SamplingParams, request_id: str,
                       lora_request: Any = None, trace_headers: Optional[Mapping[str, str]] = None,
                       priority: int = 0) -> AsyncGenerator[RequestOutput, None]:
        """Yield the request's outputs as its output kind asks; a bad request raises before the first."""
        if self._dead_error is not None:
            raise self._dead_error
        if not self.is_running:
            if not self.start_engine_loop:
                raise RuntimeError("Background loop is not running. Call start_background_loop() first.")
            self.start_background_loop()
        queue = self._streams.open(request_id)
        try:
            self._submit(_Add(request_id, prompt, sampling_params,
                              dict(lora_request=lora_request, trace_headers=trace_headers, priority=priority)))
            if self.log_requests:
                logger.info("Added request %s.", request_id)
            async for output in stream_outputs(queue, request_id, self._abort_soon):
                yield output
        finally:
            self._streams.close(request_id)

    def _abort_soon(self, request_id: str) -> None:
        """Abort from a context that cannot wait (a cancelled consumer)."""
        self._submit(_Abort([request_id]))

    async def abort(self, request_id: Union[str, Iterable[str]]) -> None:
        """Abort requests; returns once the engine has dropped them (their consumers get CancelledError)."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        if not self.is_running:
            self.engine.abort_request(ids)
            return
        done = asyncio.get_running_loop().create_future()
        self._submit(_Abort(ids, done))
        await done
