"""Each request's queue of outputs, shared by the in-process and the multiprocess async engines.

The engine side puts `RequestOutput`s or one exception on a request's queue; `stream_outputs` turns the
queue into the async generator `generate()` returns, and reports a consumer that leaves early so its request
can be aborted.
"""
from __future__ import annotations

import asyncio
from typing import AsyncGenerator, Callable, Union

from pagedllm.outputs import RequestOutput


class AsyncEngineDeadError(RuntimeError):
    """The engine failed or its process died; it accepts no more requests."""


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

    def put(self, request_id: str, item: Union[RequestOutput, BaseException]) -> None:
        queue = self._queues.get(request_id)
        if queue is not None:
            queue.put_nowait(item)

    def fail_all(self, error: BaseException) -> None:
        for queue in self._queues.values():
            queue.put_nowait(error)


async def stream_outputs(queue: asyncio.Queue, request_id: str,
                         on_abandoned: Callable[[str], None]) -> AsyncGenerator[RequestOutput, None]:
    """Yield outputs until the finished one; raise a queued exception; call `on_abandoned` if the consumer
    stops before the request finished."""
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
            on_abandoned(request_id)
        raise
