"""Run `pagedllm serve` as a child process on a free local port, for scripts, tests and benchmarks.

The child imports the same pagedllm as the caller (its folder goes first on PYTHONPATH), and the block is
entered only once /health answers, so a first request never races the model load.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

from pagedllm.distributed import free_port

HOST = "127.0.0.1"
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])  # the folder that holds pagedllm/


def wait_healthy(url: str, process: subprocess.Popen, timeout: float, log_path: Optional[Path] = None) -> None:
    """Return once GET {url}/health answers 200; raise if the process exits or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"The server exited with code {process.returncode}.{_log_text(log_path)}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:  # not listening yet
            pass
        time.sleep(0.5)
    raise RuntimeError(f"The server was not healthy after {timeout} s.{_log_text(log_path)}")


def _log_text(log_path: Optional[Path]) -> str:
    return "\n" + log_path.read_text(errors="replace") if log_path else ""


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM lets uvicorn shut down cleanly; a server still running a minute later is killed."""
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def launch_server(args: list[str], log_path: Optional[Path] = None, env: Optional[dict[str, str]] = None,
                  timeout: float = 300.0) -> Iterator[str]:
    """`pagedllm serve *args` on 127.0.0.1, healthy until the block ends; yields its URL without /v1.

    Uvicorn logs warnings only unless `args` says otherwise. The server's stdout and stderr go to
    `log_path`, or to this process's own when it is None. `env` adds to this process's environment.
    """
    with launch_server_process(args, log_path, env, timeout) as (url, _):
        yield url


@contextlib.contextmanager
def launch_server_process(args: list[str], log_path: Optional[Path] = None, env: Optional[dict[str, str]] = None,
                          timeout: float = 300.0) -> Iterator[tuple[str, subprocess.Popen]]:
    """As launch_server, yielding the server's process too (for tests that signal it)."""
    port = free_port()
    command = [sys.executable, "-m", "pagedllm.entrypoints.cli", "serve", "--host", HOST, "--port", str(port),
               "--uvicorn-log-level", "warning", *args]
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_PARENT, env.get("PYTHONPATH")]))
    with open(log_path, "wb") if log_path else contextlib.nullcontext() as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT if log else None, env=env)
    url = f"http://{HOST}:{port}"
    try:
        wait_healthy(url, process, timeout, log_path)
        yield url, process
    finally:
        if process.poll() is None:
            _stop(process)
