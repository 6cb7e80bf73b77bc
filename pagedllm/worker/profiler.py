"""The torch profiler behind `start_profile()` / `stop_profile()`, writing traces to a folder set by env var."""
from __future__ import annotations

import logging
import os
from typing import Optional

import torch

logger = logging.getLogger(__name__)

PROFILER_DIR_ENVS = ("PAGEDLLM_TORCH_PROFILER_DIR", "VLLM_TORCH_PROFILER_DIR")


def profiler_dir() -> Optional[str]:
    """The trace folder from PAGEDLLM_TORCH_PROFILER_DIR, else VLLM_TORCH_PROFILER_DIR; None when unset."""
    for name in PROFILER_DIR_ENVS:
        if os.environ.get(name):
            return os.path.abspath(os.path.expanduser(os.environ[name]))
    return None


class WorkerProfiler:
    """One profiling window at a time; each window's trace is a gzipped Chrome trace named after the rank."""

    def __init__(self, rank: int, device: torch.device) -> None:
        self.rank = rank
        self.device = device
        self.profiler: Optional[torch.profiler.profile] = None

    def start(self) -> None:
        folder = profiler_dir()
        if folder is None:
            raise RuntimeError("Profiler is not enabled. Set VLLM_TORCH_PROFILER_DIR (or "
                               "PAGEDLLM_TORCH_PROFILER_DIR) to the folder that should receive the traces.")
        if self.profiler is not None:
            raise RuntimeError("The profiler is already running; call stop_profile() first.")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(
            activities=activities, record_shapes=True, with_stack=True,
            on_trace_ready=torch.profiler.tensorboard_trace_handler(folder, worker_name=f"rank{self.rank}",
                                                                    use_gzip=True))
        self.profiler.start()
        logger.info("Profiling worker %d into %s.", self.rank, folder)

    def stop(self) -> None:
        if self.profiler is None:
            raise RuntimeError("Profiler is not running; call start_profile() first.")
        profiler, self.profiler = self.profiler, None
        profiler.stop()
