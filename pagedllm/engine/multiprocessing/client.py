"""MQLLMEngineClient: AsyncLLMEngine's interface in the server process, over a pipe to the engine process.

The server process parses, validates, tokenizes and renders chat templates; the engine process only steps.
A reader thread hands each message from the engine to the event loop, and sending a command never waits for
a step. If the engine process dies, every request in flight ends with AsyncEngineDeadError at once, and so
does /health.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import threading
from typing import Any, AsyncGenerator, Iterable, Mapping, Optional, Union

from pagedllm.config import AsyncEngineArgs
from pagedllm.engine.multiprocessing.engine import run_engine
from pagedllm.engine.multiprocessing.messages import (AbortRequests, AddRequest, Answer, Outputs, Query, Ready,
                                                      Rejected, Shutdown, StartupFailed)
from pagedllm.engine.pooling import PoolingClientMixin
from pagedllm.engine.request_streams import AsyncEngineDeadError, RequestStreams, stream_outputs
from pagedllm.engine.sleep_mode import EngineSleepingError, SleepRefusedError
from pagedllm.outputs import RequestOutput
from pagedllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)
# The engine process's errors that callers tell apart, rebuilt by class name; others arrive as RuntimeError.
_ERROR_TYPES = {"ValueError": ValueError, "TypeError": TypeError, "EngineSleepingError": EngineSleepingError,
                "SleepRefusedError": SleepRefusedError}
SHUTDOWN_TIMEOUT_S = 10.0


class MQLLMEngineClient(PoolingClientMixin):
    """Start with `await MQLLMEngineClient.start(engine_args)`; `generate()` and `abort()` as AsyncLLMEngine's."""

    def __init__(self, process: multiprocessing.process.BaseProcess, conn: Any, ready: Ready,
                 log_requests: bool) -> None:
        self.process, self.conn, self.log_requests = process, conn, log_requests
        self._ready = ready
        self._streams = RequestStreams()
        self._answers: dict[int, asyncio.Future] = {}
        self._query_ids = itertools.count()
        self._dead_error: Optional[AsyncEngineDeadError] = None
        self._closing = False
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._read, name="pagedllm-engine-client", daemon=True).start()

    @classmethod
    async def start(cls, engine_args: AsyncEngineArgs) -> "MQLLMEngineClient":
        """Start the engine process and wait (off the event loop) until its engine is built."""
        context = multiprocessing.get_context("spawn")
        conn, child_conn = context.Pipe(duplex=True)
        process = context.Process(target=run_engine, args=(engine_args, child_conn), name="pagedllm-engine")
        process.start()
        child_conn.close()  # only the child holds its end now, so its death reads as EOF here
        logger.info("Started the engine process (pid %d).", process.pid)
        try:
            ready = await asyncio.to_thread(conn.recv)
        except EOFError:
            process.join()
            raise RuntimeError(f"The engine process exited during start-up (exit code {process.exitcode}).") from None
        if isinstance(ready, StartupFailed):
            process.join()
            raise RuntimeError(f"The engine failed to start: {ready.message}")
        log_requests = not getattr(engine_args, "disable_log_requests", False)
        return cls(process, conn, ready, log_requests)

    # --- state --------------------------------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        return self._dead_error is None and self.process.is_alive()

    @property
    def errored(self) -> bool:
        return self._dead_error is not None or not self.process.is_alive()

    @property
    def dead_error(self) -> Optional[BaseException]:
        return self._dead_error

    async def check_health(self) -> None:
        """Raise AsyncEngineDeadError at once if the engine process is gone; else ask it about its workers."""
        if not self.process.is_alive() and self._dead_error is None:
            self._engine_died()
        if self._dead_error is not None:
            raise self._dead_error
        await self._query("health")

    async def metrics_text(self) -> bytes:
        """The engine process's Prometheus metrics, in the text format."""
        return await self._query("metrics")

    async def sleep(self, level: int = 1) -> None:
        await self._query("sleep", (level,))

    async def wake_up(self, tags: Optional[list[str]] = None) -> None:
        await self._query("wake_up", (tags,))

    async def is_sleeping(self) -> bool:
        return await self._query("is_sleeping")

    async def get_tokenizer(self, lora_request: Any = None) -> Any:
        return self._ready.tokenizer

    async def get_model_config(self) -> Any:
        return self._ready.model_config

    async def get_scheduler_config(self) -> Any:
        return self._ready.scheduler_config

    async def get_default_sampling_params(self) -> SamplingParams:
        return self._ready.default_params

    # --- the pipe -----------------------------------------------------------------------------------------

    def _read(self) -> None:
        """In a thread: hand each message to the event loop; the pipe closing means the engine is gone."""
        try:
            while True:
                message = self.conn.recv()
                self._loop.call_soon_threadsafe(self._handle, message)
        except (EOFError, OSError):
            try:
                self._loop.call_soon_threadsafe(self._engine_died)
            except RuntimeError:  # the event loop is closed: the server has ended
                pass

    def _handle(self, message: Any) -> None:
        if isinstance(message, Outputs):
            for output in message.outputs:
                self._streams.put(output.request_id, output)
        elif isinstance(message, Rejected):
            self._streams.put(message.request_id, _rebuilt(message.kind, message.message))
        elif isinstance(message, Answer):
            future = self._answers.pop(message.query_id, None)
            if future is not None and not future.done():
                if message.error is None:
                    future.set_result(message.value)
                else:
                    future.set_exception(_rebuilt(message.kind, message.error))

    def _engine_died(self) -> None:
        if self._dead_error is not None:
            return
        self.process.join(timeout=1.0)
        code = self.process.exitcode
        self._dead_error = AsyncEngineDeadError(
            f"The engine process exited unexpectedly (exit code {code}). The server serves no more requests; "
            "restart it.")
        if not self._closing:
            logger.error("The engine process died (exit code %s); failing %d request(s) in flight.", code,
                         len(self._streams))
        self._streams.fail_all(self._dead_error)
        for future in self._answers.values():
            if not future.done():
                future.set_exception(self._dead_error)
        self._answers.clear()

    def _send(self, message: Any) -> None:
        if self._dead_error is not None:
            raise self._dead_error
        try:
            self.conn.send(message)
        except (OSError, EOFError):
            self._engine_died()
            raise self._dead_error from None

    async def _query(self, what: str, args: tuple = ()) -> Any:
        query_id = next(self._query_ids)
        future = self._answers[query_id] = self._loop.create_future()
        self._send(Query(query_id, what, args))
        return await future

    # LoRA adapters, applied by the engine process between two steps.
    async def add_lora(self, lora_request: Any) -> bool:
        return await self._query("add_lora", (lora_request,))

    async def remove_lora(self, lora_id: int) -> bool:
        return await self._query("remove_lora", (lora_id,))

    async def list_loras(self) -> set[int]:
        return await self._query("list_loras")

    # --- requests -----------------------------------------------------------------------------------------

    async def generate(self, prompt: Any, sampling_params: SamplingParams, request_id: str,
                       lora_request: Any = None, trace_headers: Optional[Mapping[str, str]] = None,
                       priority: int = 0) -> AsyncGenerator[RequestOutput, None]:
        """Yield the request's outputs; a request the engine refuses raises its error before the first."""
        if self._dead_error is not None:
            raise self._dead_error
        queue = self._streams.open(request_id)
        try:
            self._send(AddRequest(request_id, prompt, sampling_params,
                                  dict(trace_headers) if trace_headers else None, priority, lora_request))
            if self.log_requests:
                logger.info("Added request %s.", request_id)
            async for output in stream_outputs(queue, request_id, self._abort_soon):
                yield output
        finally:
            self._streams.close(request_id)

    def _abort_soon(self, request_id: str) -> None:
        """Abort for a consumer that left; nothing to do once the engine is gone."""
        try:
            self._send(AbortRequests([request_id]))
        except AsyncEngineDeadError:
            return
        if self.log_requests:
            logger.info("Aborted request %s.", request_id)

    async def abort(self, request_id: Union[str, Iterable[str]]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self._send(AbortRequests(ids))
        for one in ids:
            self._streams.put(one, asyncio.CancelledError(f"Request {one} was aborted."))
            if self.log_requests:
                logger.info("Aborted request %s.", one)

    def shutdown(self) -> None:
        """Ask the engine process to exit; kill it if it has not within SHUTDOWN_TIMEOUT_S seconds."""
        if self._closing:
            return
        self._closing = True
        if self.process.is_alive():
            try:
                self.conn.send(Shutdown())
            except OSError:
                pass
            self.process.join(SHUTDOWN_TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def _rebuilt(kind: str, message: str) -> Exception:
    """The engine process's error of class `kind` on this side."""
    error_type = _ERROR_TYPES.get(kind)
    return error_type(message) if error_type is not None else RuntimeError(f"{kind}: {message}")
