"""A worker: the model, its KV cache and a model runner on one device."""
from __future__ import annotations

import logging
from typing import Optional

import torch

from pagedllm.config import EngineConfig
from pagedllm.core.runner_output import ModelRunnerOutput
from pagedllm.core.scheduler_output import SchedulerOutput
from pagedllm.model.loader import load_model
from pagedllm.worker.model_runner import ModelRunner
from pagedllm.worker.profiler import WorkerProfiler
from pagedllm.worker.swap import SwapSpace

logger = logging.getLogger(__name__)


class Worker:
    def __init__(self, config: EngineConfig, rank: int = 0, distributed_init_method: Optional[str] = None) -> None:
        self.config = config
        self.rank = rank
        self.distributed_init_method = distributed_init_method
        self.device = torch.device(config.device_config.device)
        self.model_runner: ModelRunner | None = None
        self.swap_space: SwapSpace | None = None
        self.profiler = WorkerProfiler(rank, self.device)

    def load_model(self) -> None:
        torch.manual_seed(self.config.model_config.seed)
        model = load_model(self.config.model_config, str(self.device))
        self.model_runner = ModelRunner(self.config, model, self.device)

    def block_bytes(self) -> int:
        """Bytes of one KV cache block over all layers, keys and values."""
        hf = self.config.model_config.hf_config
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        element = torch.tensor([], dtype=self.config.model_config.dtype).element_size()
        return (2 * hf.num_hidden_layers * self.config.cache_config.block_size * hf.num_key_value_heads
                * head_dim * element)

    def determine_num_available_blocks(self) -> int:
        cache = self.config.cache_config
        if cache.num_gpu_blocks_override is not None:
            return cache.num_gpu_blocks_override
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = free - total * (1 - cache.gpu_memory_utilization)
        else:
            budget = cache.kv_cache_memory
        num_blocks = int(budget // self.block_bytes())
        if num_blocks < 1:
            raise ValueError(f"No room for the KV cache: {budget / 2**30:.2f} GiB available, "
                             f"{self.block_bytes()} bytes needed per block.")
        return num_blocks

    def num_swap_blocks(self) -> int:
        """Blocks that fit in `swap_space` GiB of host memory (none unless preempting by swap)."""
        if self.config.scheduler_config.preemption_mode != "swap":
            return 0
        return self.config.cache_config.swap_space_bytes // self.block_bytes()

    def initialize_cache(self, num_blocks: int) -> None:
        self.model_runner.initialize_cache(num_blocks)
        if self.num_swap_blocks():
            self.swap_space = SwapSpace(self.model_runner.kv_caches, self.num_swap_blocks())

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """One step: the block copies of preempted and resumed requests, then the forward pass."""
        if scheduler_output.blocks_to_swap_out:
            self.swap_space.swap_out(scheduler_output.blocks_to_swap_out)
        if scheduler_output.blocks_to_swap_in:
            self.swap_space.swap_in(scheduler_output.blocks_to_swap_in)
        return self.model_runner.execute_model(scheduler_output)

    def start_profile(self) -> None:
        self.profiler.start()

    def stop_profile(self) -> None:
        self.profiler.stop()

    def check_health(self) -> None:
        if self.model_runner is None:
            raise RuntimeError("The worker has no model loaded.")

    def shutdown(self) -> None:
        """Release what outlives the worker object: nothing yet in a single process."""
