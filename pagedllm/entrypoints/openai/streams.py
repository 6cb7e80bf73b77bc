"""Async iteration helpers for the server: merge several request streams, stop when the client leaves.

Both cancel what they iterate when they stop early, and cancelling an `AsyncLLMEngine.generate`
consumer aborts its request, so a client that goes away frees its requests within one engine step.
"""
from __future__ import annotations

import asyncio
import time
from http import HTTPStatus
from typing import AsyncIterator, Optional, TypeVar

from starlette.requests import Request

from pagedllm.entrypoints.openai.errors import APIError, ClientDisconnected

T = TypeVar("T")
_DONE = object()


async def merge_async_iterators(*iterators: AsyncIterator[T]) -> AsyncIterator[tuple[int, T]]:
    """Yield (index of the iterator, item) as items arrive from any of them; the first error is raised."""
    queue: asyncio.Queue = asyncio.Queue()

    async def drain(index: int, iterator: AsyncIterator[T]) -> None:
        try:
            async for item in iterator:
                queue.put_nowait((index, item))
            queue.put_nowait((index, _DONE))
        except BaseException as error:  # including an engine-side abort's CancelledError
            queue.put_nowait((index, error))
            raise

    tasks = [asyncio.ensure_future(drain(i, it)) for i, it in enumerate(iterators)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item = await queue.get()
            if item is _DONE:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()


async def _client_gone(raw_request: Request) -> None:
    # Once the body is read, the server's receive() returns only when the client disconnects.
    while (await raw_request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(stream: AsyncIterator[T], raw_request: Request,
                             timeout: Optional[float] = None) -> AsyncIterator[T]:
    """Yield from `stream` until it ends; raise ClientDisconnected if the client leaves, or a 504 APIError
    once `timeout` seconds have passed (either way cancelling `stream`)."""
    gone = asyncio.ensure_future(_client_gone(raw_request))
    deadline = None if timeout is None else time.monotonic() + timeout
    pending: Optional[asyncio.Future] = None
    try:
        while True:
            pending = asyncio.ensure_future(stream.__anext__())
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.wait({pending, gone}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if gone.done():
                raise ClientDisconnected()
            if not pending.done():
                raise APIError(f"The request did not finish within the server's timeout of {timeout} s.",
                               HTTPStatus.GATEWAY_TIMEOUT)
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        gone.cancel()
        if pending is not None and not pending.done():
            pending.cancel()
        elif hasattr(stream, "aclose"):
            await stream.aclose()
