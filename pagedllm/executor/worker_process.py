"""A worker in a process of its own: the loop that runs in it, and the handle the executor keeps.

The worker is a fresh interpreter (`python -m pagedllm.executor.worker_process FD`), never a fork of a
process that has started torch, and unlike multiprocessing's spawn it does not re-run the user's main
script, so scripts need no `if __name__ == "__main__"` guard. The executor talks to it over a private socket
pair: the first message is (config, rank, distributed init address); then each call is (method, args,
kwargs) pickled with cloudpickle (so a function, or a request's lambda logits processor, can travel) and
each reply is (ok, result or error text). The worker exits when the socket closes, when it is told to, or
when its parent process is gone.
"""
from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any, Optional

import cloudpickle

SHUTDOWN = b"shutdown"
# How often a worker checks that the process that started it is still alive.
PARENT_CHECK_SECONDS = 1.0


class WorkerDiedError(RuntimeError):
    """A worker process is gone, or failed a call; the executor can no longer run steps."""


def worker_main(conn: Connection) -> None:
    """The worker process: build the worker, then answer calls until told to stop or orphaned."""
    from pagedllm.worker.worker import Worker

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    _exit_with_parent(os.getppid())
    config, rank, distributed_init_method = pickle.loads(conn.recv_bytes())
    worker = Worker(config, rank, distributed_init_method)
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            break
        if message == SHUTDOWN:
            break
        method, args, kwargs = pickle.loads(message)
        try:
            if isinstance(method, str):
                reply = (True, getattr(worker, method)(*args, **kwargs))
            else:
                reply = (True, method(worker, *args, **kwargs))
        except Exception as error:  # reported to the executor, which decides what it means
            reply = (False, f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
        try:
            conn.send_bytes(pickle.dumps(reply))
        except (BrokenPipeError, OSError):
            break
    worker.shutdown()


def _exit_with_parent(parent_pid: int) -> None:
    """Exit as soon as the parent is gone (killed, say), even in the middle of a call."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="pagedllm-parent-watch").start()


class WorkerProcess:
    """The executor's handle on one worker process."""

    def __init__(self, config: Any, rank: int, distributed_init_method: Optional[str]) -> None:
        self.rank = rank
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen([sys.executable, "-m", __name__, str(theirs.fileno())],
                                        pass_fds=[theirs.fileno()])
        theirs.close()
        self.conn = Connection(ours.detach())
        self.send(cloudpickle.dumps((config, rank, distributed_init_method)))

    @property
    def pid(self) -> int:
        return self.process.pid

    def is_alive(self) -> bool:
        return self.process.poll() is None

    def send(self, message: bytes) -> None:
        try:
            self.conn.send_bytes(message)
        except (BrokenPipeError, OSError):
            raise self.death_error() from None

    def read_reply(self, method: str) -> Any:
        """The reply to the call sent last, once the socket is readable; raises WorkerDiedError if the
        process died (its socket then reads as closed) or the call failed."""
        try:
            ok, result = pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            raise self.death_error() from None
        if not ok:
            raise WorkerDiedError(f"Worker {self.rank} (pid {self.pid}) failed in {method}: {result}")
        return result

    def death_error(self) -> WorkerDiedError:
        try:
            code = self.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            code = None
        return WorkerDiedError(f"Worker {self.rank} (pid {self.pid}) died (exit code {code}).")

    def stop(self, grace: float = 5.0) -> None:
        """Ask the worker to exit; terminate it, then kill it, if it does not within `grace` seconds."""
        for stop in (self._ask_to_exit, self.process.terminate, self.process.kill):
            if not self.is_alive():
                break
            stop()
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        self.conn.close()

    def _ask_to_exit(self) -> None:
        try:
            self.conn.send_bytes(SHUTDOWN)
        except (BrokenPipeError, OSError):
            pass


def encode_call(method: Any, args: tuple, kwargs: dict) -> bytes:
    return cloudpickle.dumps((method, args, kwargs))


def gather_replies(workers: list[WorkerProcess], method: str, timeout: Optional[float]) -> list[Any]:
    """Every worker's reply in rank order, read as they come: a worker that dies is noticed at once even
    while the others wait for it inside a collective operation."""
    pending = {worker.conn: worker for worker in workers}
    replies: dict[int, Any] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = wait(list(pending), left)
        if not ready:
            late = ", ".join(f"{w.rank} (pid {w.pid})" for w in pending.values())
            raise TimeoutError(f"Workers {late} did not answer {method} within {timeout} s.")
        for conn in ready:
            worker = pending.pop(conn)
            replies[worker.rank] = worker.read_reply(method)
    return [replies[worker.rank] for worker in workers]


if __name__ == "__main__":
    worker_main(Connection(int(sys.argv[1])))
