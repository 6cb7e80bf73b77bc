"""The `ray` executor: one Ray actor per worker, placed by a placement group of one bundle per worker.

It joins the cluster named by RAY_ADDRESS (one started with `ray start --head` and `ray start
--address=...` on each machine), or starts a local one. The workers are the same `Worker`s the `mp` executor
runs, with the same boundary; rank 0's node hosts the torch.distributed rendezvous.
"""
from __future__ import annotations

import os
import socket
import sys
from typing import Any, Callable, Optional, Union

from pagedllm.core.runner_output import ModelRunnerOutput
from pagedllm.core.scheduler_output import SchedulerOutput
from pagedllm.executor.base import ExecutorBase
from pagedllm.executor.worker_process import WorkerDiedError

# Seconds to wait for the cluster to find room for every worker's bundle.
PLACEMENT_TIMEOUT = 120.0


class RayWorkerWrapper:
    """The actor: holds a Worker once it is told the rendezvous address, and runs calls on it."""

    def __init__(self, config: Any, rank: int) -> None:
        self.config, self.rank = config, rank
        self.worker: Any = None

    def node_address(self) -> str:
        """This node's IP address and a port free on it, for the torch.distributed rendezvous."""
        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as sock:
            sock.bind(("", 0))
            return f"tcp://{ip}:{sock.getsockname()[1]}"

    def start_worker(self, distributed_init_method: Optional[str]) -> None:
        from pagedllm.worker.worker import Worker

        self.worker = Worker(self.config, self.rank, distributed_init_method)

    def execute_method(self, method: Union[str, Callable], *args: Any, **kwargs: Any) -> Any:
        if isinstance(method, str):
            return getattr(self.worker, method)(*args, **kwargs)
        return method(self.worker, *args, **kwargs)


class RayExecutor(ExecutorBase):
    def _init_executor(self) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        world_size = self.config.parallel_config.world_size
        on_gpu = self.config.device_config.device == "cuda"
        if not ray.is_initialized():
            address = os.environ.get("RAY_ADDRESS")
            # A local cluster counts at least one CPU per worker: CPU workers share the cores, as under mp.
            ray.init(address=address, num_cpus=None if address else max(os.cpu_count() or 1, world_size),
                     log_to_driver=True)
        bundle = {"GPU": 1.0} if on_gpu else {"CPU": 1.0}
        self.placement_group = placement_group([bundle] * world_size, strategy="PACK")
        ready, _ = ray.wait([self.placement_group.ready()], timeout=PLACEMENT_TIMEOUT)
        if not ready:
            ray.util.remove_placement_group(self.placement_group)
            raise RuntimeError(f"The Ray cluster found no room for {world_size} workers of {bundle} each within "
                               f"{PLACEMENT_TIMEOUT:.0f} s; its resources: {ray.cluster_resources()}.")
        actor_class = ray.remote(num_cpus=0 if on_gpu else 1, num_gpus=1 if on_gpu else 0)(RayWorkerWrapper)
        worker_config = self.config.for_worker_processes()
        self.actors = [actor_class.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            self.placement_group, placement_group_bundle_index=rank)).remote(worker_config, rank)
            for rank in range(world_size)]
        self._failure: Optional[BaseException] = None
        address = ray.get(self.actors[0].node_address.remote()) if world_size > 1 else None
        self._gather([actor.start_worker.remote(address) for actor in self.actors], "start_worker", None)
        self.collective_rpc("load_model")

    def collective_rpc(self, method: Union[str, Callable], timeout: Optional[float] = None,
                       args: tuple = (), kwargs: Optional[dict] = None) -> list[Any]:
        if self._failure is not None:
            raise WorkerDiedError(f"The executor's workers have failed: {self._failure}")
        if not self.actors:
            raise RuntimeError("The executor has been shut down.")
        name = method if isinstance(method, str) else getattr(method, "__name__", repr(method))
        refs = [actor.execute_method.remote(method, *args, **(kwargs or {})) for actor in self.actors]
        return self._gather(refs, name, timeout)

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> Callable[[], ModelRunnerOutput]:
        if self._failure is not None:
            raise WorkerDiedError(f"The executor's workers have failed: {self._failure}")
        refs = [actor.execute_method.remote("execute_model", scheduler_output) for actor in self.actors]
        return lambda: self._gather(refs, "execute_model", None)[self.output_rank]

    def _gather(self, refs: list[Any], method: str, timeout: Optional[float]) -> list[Any]:
        """Results in rank order, checked as they come, so that a dead actor is noticed while the others
        wait for it inside a collective operation."""
        import ray

        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        pending, results = list(refs), {}
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not ready:
                self._fail(TimeoutError(f"Workers {sorted(rank_of[r] for r in pending)} did not answer {method} "
                                        f"within {timeout} s."))
            for ref in ready:
                try:
                    results[rank_of[ref]] = ray.get(ref)
                except ray.exceptions.RayActorError as error:
                    self._fail(WorkerDiedError(f"Worker {rank_of[ref]} (a Ray actor) died in {method}: {error}"))
                except ray.exceptions.RayTaskError as error:
                    self._fail(WorkerDiedError(f"Worker {rank_of[ref]} (a Ray actor) failed in {method}: "
                                               f"{error.cause!r}"))
        return [results[rank] for rank in range(len(refs))]

    def _fail(self, error: BaseException) -> None:
        self._failure = error
        self.shutdown()
        raise error

    def check_health(self) -> None:
        if self._failure is not None:
            raise WorkerDiedError(f"The executor's workers have failed: {self._failure}")
        self._gather([actor.execute_method.remote("check_health") for actor in self.actors], "check_health", 10.0)

    def shutdown(self) -> None:
        import ray

        actors, self.actors = getattr(self, "actors", []), []
        if not actors or sys.is_finalizing():  # at exit, Ray ends the driver's actors itself
            return
        for actor in actors:
            ray.kill(actor)
        ray.util.remove_placement_group(self.placement_group)
