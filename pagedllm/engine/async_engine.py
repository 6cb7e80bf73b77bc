"""AsyncLLMEngine: an LLMEngine behind asyncio, stepped by a background task while there is work.

The engine itself is not thread-safe, so every touch of it (adding, aborting, stepping) happens under one
asyncio lock; the blocking `step()` runs in a one-thread executor so the event loop keeps serving clients
while the model computes. Each request has a queue its `generate()` consumer reads from.
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncGenerator, Iterable, Mapping, Optional, Union

from pagedllm.config import AsyncEngineArgs, ModelConfig
from pagedllm.engine.engine_compat import UsageContext
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.inputs import PromptType
from pagedllm.outputs import RequestOutput
from pagedllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class AsyncEngineDeadError(RuntimeError):
    """The background loop failed; the engine accepts no more requests."""


class AsyncLLMEngine:
    """`generate()` is an async generator of `RequestOutput`s; closing or cancelling it aborts the request."""

    def __init__(self, engine: LLMEngine, log_requests: bool = True, start_engine_loop: bool = True) -> None:
        self.engine = engine
        self.log_requests = log_requests
        self.start_engine_loop = start_engine_loop
        self._streams: dict[str, asyncio.Queue] = {}
        self._pending_aborts: set[str] = set()
        self._step_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagedllm-step")
        self._loop_task: Optional[asyncio.Task] = None
        self._lock: Optional[asyncio.Lock] = None
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

    async def get_default_sampling_params(self) -> SamplingParams:
        return self.engine.get_default_sampling_params()

    async def is_tracing_enabled(self) -> bool:
        return self.engine.is_tracing_enabled()

    async def do_log_stats(self, scheduler_outputs: Any = None, model_output: Any = None) -> None:
        self.engine.do_log_stats()

    async def start_profile(self) -> None:
        self.engine.start_profile()

    async def stop_profile(self) -> None:
        self.engine.stop_profile()

    # --- the background loop ------------------------------------------------------------------------------

    def start_background_loop(self) -> None:
        """Start stepping the engine on the running event loop."""
        if self._dead_error is not None:
            raise self._dead_error
        if self.is_running:
            raise RuntimeError("Background loop is already running.")
        # Locks and events belong to one event loop; a new loop gets new ones.
        self._lock, self._has_work = asyncio.Lock(), asyncio.Event()
        self._loop_task = asyncio.get_running_loop().create_task(self._run_loop(), name="pagedllm-engine-loop")

    def shutdown_background_loop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            self._loop_task = None

    async def _run_loop(self) -> None:
        try:
            while True:
                outputs = await self._step_once()
                if outputs is None:
                    await self._has_work.wait()
                    continue
                for output in outputs:
                    queue = self._streams.get(output.request_id)
                    if queue is not None:
                        queue.put_nowait(output)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the engine's state is unknown now: fail everything in flight
            self._fail_all(error)

    async def _step_once(self) -> Optional[list[RequestOutput]]:
        """One engine step after applying pending aborts; None (and idle) when there is nothing to run."""
        async with self._lock:
            self._apply_aborts(self._pending_aborts)
            self._pending_aborts = set()
            if not self.engine.has_unfinished_requests():
                self._has_work.clear()
                return None
            return await asyncio.get_running_loop().run_in_executor(self._step_thread, self.engine.step)

    def _fail_all(self, error: Exception) -> None:
        logger.error("Engine loop failed; failing %d request(s) in flight.", len(self._streams), exc_info=error)
        dead = AsyncEngineDeadError(
            f"The engine loop failed with {type(error).__name__}: {error}. The engine serves no more "
            "requests; restart it.")
        dead.__cause__ = error
        self._dead_error = dead
        for queue in self._streams.values():
            queue.put_nowait(dead)

    def _apply_aborts(self, request_ids: Iterable[str]) -> None:
        ids = list(request_ids)
        if not ids:
            return
        self.engine.abort_request(ids)
        self.engine.do_log_stats()  # the loop may go idle now: let the gauges see the aborts
        for request_id in ids:
            queue = self._streams.get(request_id)
            if queue is not None:
                queue.put_nowait(asyncio.CancelledError(f"Request {request_id} was aborted."))
            if self.log_requests:
                logger.info("Aborted request %s.", request_id)

    # --- requests -----------------------------------------------------------------------------------------

    async def generate(self, prompt: PromptType, sampling_params: SamplingParams, request_id: str,
                       lora_request: Any = None, trace_headers: Optional[Mapping[str, str]] = None,
                       priority: int = 0) -> AsyncGenerator[RequestOutput, None]:
        """Yield the request's outputs as its output kind asks; a bad request raises before the first."""
        queue = await self._add_request(request_id, prompt, sampling_params, lora_request, trace_headers,
                                        priority)
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        except (asyncio.CancelledError, GeneratorExit):
            if not finished:
                self._abort_soon(request_id)
            raise
        finally:
            self._streams.pop(request_id, None)

    async def _add_request(self, request_id: str, prompt: PromptType, params: SamplingParams,
                           lora_request: Any, trace_headers: Optional[Mapping[str, str]],
                           priority: int) -> asyncio.Queue:
        if self._dead_error is not None:
            raise self._dead_error
        if not self.is_running:
            if not self.start_engine_loop:
                raise RuntimeError("Background loop is not running. Call start_background_loop() first.")
            self.start_background_loop()
        async with self._lock:
            if request_id in self._streams:
                raise ValueError(f"Request id {request_id!r} is already in use by an unfinished request.")
            self.engine.add_request(request_id, prompt, params, lora_request=lora_request,
                                    trace_headers=trace_headers, priority=priority)
            queue = self._streams[request_id] = asyncio.Queue()
        self._has_work.set()
        if self.log_requests:
            logger.info("Added request %s.", request_id)
        return queue

    def _abort_soon(self, request_id: str) -> None:
        """Abort from a context that cannot wait (a cancelled consumer): the loop applies it before its next
        step."""
        self._pending_aborts.add(request_id)
        if self._has_work is not None:
            self._has_work.set()

    async def abort(self, request_id: Union[str, Iterable[str]]) -> None:
        """Abort requests now; their consumers get CancelledError and their blocks are freed."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        if self._lock is None:
            self.engine.abort_request(ids)
            return
        async with self._lock:
            self._apply_aborts(ids)
