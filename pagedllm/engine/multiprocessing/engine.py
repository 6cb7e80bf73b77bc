"""The engine process: an LLMEngine stepped in a loop that never waits for the HTTP server.

A reader thread moves what the server sends into a queue; the main thread applies it between steps (adds,
aborts, queries) and sends each step's outputs back. A request the engine refuses is answered alone and the
loop goes on. When the server's end of the pipe closes (the server exited or was killed) the process exits,
so it never outlives the server.
"""
from __future__ import annotations

import logging
import queue
import signal
import threading
from multiprocessing.connection import Connection
from typing import Any

from pagedllm.config import AsyncEngineArgs
from pagedllm.engine.multiprocessing.messages import (AbortRequests, AddRequest, Answer, Outputs, Query, Ready,
                                                      Rejected, Shutdown, StartupFailed)

logger = logging.getLogger(__name__)


def run_engine(engine_args: AsyncEngineArgs, conn: Connection) -> None:
    """The engine process's entry point."""
    # The server decides when this process ends (a Shutdown message, or its end of the pipe closing), so
    # that Ctrl-C or SIGTERM sent to the whole process group lets the server drain first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(name)s: %(message)s")
    try:
        from pagedllm.engine.llm_engine import LLMEngine

        engine = LLMEngine.from_engine_args(engine_args)
    except Exception as error:
        logger.exception("The engine failed to start.")
        conn.send(StartupFailed(f"{type(error).__name__}: {error}"))
        return
    conn.send(Ready(engine.get_model_config(), engine.get_scheduler_config(), engine.get_tokenizer(),
                    engine.get_default_sampling_params()))
    inbox: queue.Queue = queue.Queue()
    threading.Thread(target=_read, args=(conn, inbox), name="pagedllm-engine-reader", daemon=True).start()
    _EngineLoop(engine, conn, inbox).run()


_LORA_CALLS = ("add_lora", "remove_lora", "list_loras")


def _read(conn: Connection, inbox: queue.Queue) -> None:
    try:
        while True:
            inbox.put(conn.recv())
    except (EOFError, OSError):  # the server is gone
        inbox.put(Shutdown())


class _EngineLoop:
    def __init__(self, engine: Any, conn: Connection, inbox: queue.Queue) -> None:
        self.engine, self.conn, self.inbox = engine, conn, inbox

    def run(self) -> None:
        while True:
            idle = not self.engine.has_unfinished_requests()
            for message in self._messages(block=idle):
                if isinstance(message, Shutdown):
                    return
                self._apply(message)
            if self.engine.has_unfinished_requests():
                outputs = self.engine.step()
                if outputs:
                    self.conn.send(Outputs(outputs))

    def _messages(self, block: bool) -> list[Any]:
        messages = [self.inbox.get()] if block else []
        while True:
            try:
                messages.append(self.inbox.get_nowait())
            except queue.Empty:
                return messages

    def _apply(self, message: Any) -> None:
        if isinstance(message, AddRequest):
            try:
                self.engine.add_request(message.request_id, message.prompt, message.params,
                                        lora_request=message.lora_request, trace_headers=message.trace_headers,
                                        priority=message.priority)
            except Exception as error:  # a request the engine refuses fails alone
                self.conn.send(Rejected(message.request_id, type(error).__name__, str(error)))
        elif isinstance(message, AbortRequests):
            self.engine.abort_request(message.request_ids)
            self.engine.do_log_stats()  # the loop may go idle now: let the gauges see the aborts
        elif isinstance(message, Query):
            self.conn.send(self._answer(message))

    def _answer(self, query: Query) -> Answer:
        try:
            if query.what == "health":
                self.engine.check_health()
                return Answer(query.query_id)
            if query.what == "metrics":
                from prometheus_client import generate_latest

                return Answer(query.query_id, generate_latest())
            if query.what in ("sleep", "wake_up", "is_sleeping", *_LORA_CALLS):
                return Answer(query.query_id, getattr(self.engine, query.what)(*query.args))
            return Answer(query.query_id, error=f"Unknown query {query.what!r}.", kind="ValueError")
        except Exception as error:
            return Answer(query.query_id, error=str(error), kind=type(error).__name__)
