"""Each request's queue of outputs, shared by the in-process and the multiprocess async engines.

The engine side puts `RequestOutput`s or one exception on a request's queue; `stream_outputs` turns the
queue into the async generator `generate()` returns, and reports a consumer that leaves early so its request
can be aborted.
"""
from __future__ import annotations

import asyncio
from typing import AsyncGenerator, Callable, Optional, Union

from pagedllm.engine.output_processor import is_client_failure
from pagedllm.outputs import PoolingRequestOutput, RequestOutput


class AsyncEngineDeadError(RuntimeError):
    """The engine failed or its process died; it accepts no more requests."""


class RequestFailedError(RuntimeError):
    """This request failed on its own while its batch ran (its logits processor, grammar, seed, NaN logits,
    output processing); the engine goes on serving the others."""


class RequestParametersError(RequestFailedError):
    """This request failed on its own because its parameters together left no token to sample (say min_tokens
    barring the end that its guided choice has reached): the client's error, not the server's."""


def failure(output: RequestOutput) -> Optional[RequestFailedError]:
    """The error of a finished output one of whose completions ended with finish_reason "error"."""
    reasons = [str(c.stop_reason) for c in output.outputs if c.finish_reason == "error"]
    if not output.finished or not reasons:
        return None
    error = RequestParametersError if is_client_failure(reasons[0]) else RequestFailedError
    return error(f"Request {output.request_id} failed: {reasons[0]}")


class RequestStreams:
    """request id -> queue of outputs (or an exception that ends the stream)."""

    def __init__(self) -> None:
        self._queues: dict[str, asyncio.Queue] = {}

    def __len__(self) -> int:
        return len(self._queues)

    def open(self, request_id: str) -> asyncio.Queue:
        if request_id in self._queues:
            raise ValueError(f"Request id {request_id!r} is already in use by an unfinished request.")
        queue = self._queues[request_id] = asyncio.Queue()
        return queue

    def close(self, request_id: str) -> None:
        self._queues.pop(request_id, None)

    def put(self, request_id: str, item: Union[RequestOutput, PoolingRequestOutput, BaseException]) -> None:
        queue = self._queues.get(request_id)
        if queue is not None:
            queue.put_nowait(item)

    def fail_all(self, error: BaseException) -> None:
        for queue in self._queues.values():
            queue.put_nowait(error)


async def stream_outputs(queue: asyncio.Queue, request_id: str,
                         on_abandoned: Callable[[str], None]) -> AsyncGenerator[RequestOutput, None]:
    """Yield outputs until the finished one; raise a queued exception, or RequestFailedError for a request
    that failed on its own; call `on_abandoned` if the consumer stops before the request finished."""
    finished = False
    try:
        while not finished:
            item = await queue.get()
            if not isinstance(item, BaseException):  # a RequestOutput or a PoolingRequestOutput
                finished = item.finished
            if isinstance(item, RequestOutput):
                item = failure(item) or item
            if isinstance(item, BaseException):
                finished = True
                raise item
            yield item
    except (asyncio.CancelledError, GeneratorExit):
        if not finished:
            on_abandoned(request_id)
        raise
