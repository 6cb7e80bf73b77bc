"""A real `pagedllm serve` process on a free local port, for the HTTP API tests."""
from __future__ import annotations

import contextlib
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import pytest

from pagedllm.entrypoints.openai import launch

API_KEY = "test-key"
MAX_BODY_BYTES = 256 * 1024


@dataclass
class RunningServer:
    url: str  # without /v1
    log_path: Path  # the server's stderr and stdout
    process: subprocess.Popen
    api_key: str = API_KEY
    max_body_bytes: int = MAX_BODY_BYTES

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def running_server(log_dir: Path, args: list[str], env: Optional[dict[str, str]] = None
                   ) -> Iterator[RunningServer]:
    """A `pagedllm serve` process with `args`, logging to `log_dir`, healthy until the block ends."""
    log_path = log_dir / "server.log"
    with launch.launch_server_process(args, log_path, env) as (url, process):
        yield RunningServer(url, log_path, process)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("server"),
                        ["--api-key", API_KEY, "--max-request-body-bytes", str(MAX_BODY_BYTES),
                         "--num-gpu-blocks-override", "1024"]) as running:
        yield running


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory, tiny_model_dir) -> Iterator[RunningServer]:
    """The tiny model behind the default server (engine in its own process), shared by the robustness tests:
    a short context keeps every generation cheap."""
    with running_server(tmp_path_factory.mktemp("tiny-server"),
                        [tiny_model_dir, "--api-key", API_KEY, "--max-request-body-bytes", str(MAX_BODY_BYTES),
                         "--max-model-len", "128", "--num-gpu-blocks-override", "128"]) as running:
        yield running


@pytest.fixture(scope="module")
def launch_server():
    """`with launch_server(log_dir, args, env) as server:` starts another server with other flags."""
    return running_server
