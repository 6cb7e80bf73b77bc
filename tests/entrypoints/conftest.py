"""A real `pagedllm serve` process on a free local port, for the HTTP API tests."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import httpx
import pytest

API_KEY = "test-key"
MAX_BODY_BYTES = 256 * 1024
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RunningServer:
    url: str  # without /v1
    log_path: Path  # the server's stderr and stdout
    api_key: str = API_KEY
    max_body_bytes: int = MAX_BODY_BYTES

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen, log_path: Path, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"The server exited with {process.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"The server was not healthy after {timeout} s:\n{log_path.read_text()}")


@contextlib.contextmanager
def running_server(log_dir: Path, args: list[str], env: Optional[dict[str, str]] = None
                   ) -> Iterator[RunningServer]:
    """A `pagedllm serve` process with `args`, healthy on a free port until the block ends."""
    port = free_port()
    log_path = log_dir / "server.log"
    command = [sys.executable, "-m", "pagedllm.entrypoints.cli", "serve", "--host", "127.0.0.1", "--port",
               str(port), "--uvicorn-log-level", "warning", *args]
    env = {**os.environ, **(env or {}),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, log_path)
        yield RunningServer(url, log_path)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("server"),
                        ["--api-key", API_KEY, "--max-request-body-bytes", str(MAX_BODY_BYTES),
                         "--num-gpu-blocks-override", "1024"]) as running:
        yield running


@pytest.fixture(scope="module")
def launch_server():
    """`with launch_server(log_dir, args, env) as server:` starts another server with other flags."""
    return running_server
