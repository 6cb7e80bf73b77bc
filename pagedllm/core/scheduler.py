"""Iteration-level scheduling: each step, which requests compute how many of their tokens.

A request knows how many of its tokens exist and how many are computed; every step hands out tokens
within a budget so that the second count catches up with the first. Running requests go first (oldest
first); when the cache has no room for one, the most recently added running request is preempted by
recompute and goes back to the front of the waiting queue. Waiting requests are admitted only in steps
that preempted nothing.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable

from pagedllm.config import SchedulerConfig
from pagedllm.core.kv_cache import KVCacheManager
from pagedllm.core.request import Request, RequestStatus

logger = logging.getLogger(__name__)
PREEMPTION_WARNING_INTERVAL = 50


@dataclass
class SchedulerOutput:
    """One step's plan; the workers need nothing else to run it."""

    # (request, number of its tokens computed this step)
    scheduled: list[tuple[Request, int]]
    preempted: list[Request] = field(default_factory=list)
    # Requests that can never fit in the KV cache; finished without running.
    ignored: list[Request] = field(default_factory=list)
    # Requests finished since the previous step, so workers can drop their per-request state.
    finished_req_ids: set[str] = field(default_factory=set)
    # Guided requests that sample this step -> packed bitmask of their allowed tokens (set by the engine).
    grammar_bitmasks: dict[str, Any] = field(default_factory=dict)

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache: KVCacheManager) -> None:
        self.config = config
        self.kv_cache = kv_cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self._finished_req_ids: set[str] = set()

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)
        self.requests[request.request_id] = request

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted: list[Request] = []
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = self._num_new_tokens(request, budget)
            if num_new == 0:
                break
            if not self._allocate_or_preempt(request, num_new, preempted):
                break
            scheduled.append((request, num_new))
            budget -= num_new
            i += 1
        ignored: list[Request] = []
        if not preempted:
            budget = self._admit_waiting(budget, scheduled, ignored)
        finished, self._finished_req_ids = self._finished_req_ids, set()
        return SchedulerOutput(scheduled, preempted, ignored, finished)

    def _num_new_tokens(self, request: Request, budget: int) -> int:
        num_new = request.num_tokens - request.num_computed_tokens
        if num_new > budget:
            return budget if self.config.enable_chunked_prefill else 0
        return num_new

    def _allocate_or_preempt(self, request: Request, num_new: int, preempted: list[Request]) -> bool:
        """Find room for `request`, preempting from the back of the running list; False if it was itself
        preempted."""
        while not self.kv_cache.allocate_slots(request, num_new):
            victim = self.running.pop()
            self._preempt(victim)
            preempted.append(victim)
            if victim is request:
                return False
        return True

    def _admit_waiting(self, budget: int, scheduled: list[tuple[Request, int]], ignored: list[Request]) -> int:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            if not self.kv_cache.can_ever_fit(request.num_tokens):
                logger.warning("Request %s needs %d tokens of KV cache but the cache holds only %d; it is "
                               "finished without output.", request.request_id, request.num_tokens,
                               (self.kv_cache.num_blocks - self.kv_cache.watermark_blocks) *
                               self.kv_cache.block_size)
                self.waiting.popleft()
                self._finish(request, RequestStatus.FINISHED_IGNORED)
                ignored.append(request)
                continue
            num_new = self._num_new_tokens(request, budget)
            if num_new == 0 or not self.kv_cache.can_admit(request, num_new):
                break
            self.kv_cache.allocate_slots(request, num_new)
            self.waiting.popleft()
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            scheduled.append((request, num_new))
            budget -= num_new
        return budget

    def _preempt(self, request: Request) -> None:
        self.kv_cache.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)
        self.num_preemptions += 1
        if self.num_preemptions % PREEMPTION_WARNING_INTERVAL == 1:
            logger.warning(
                "Request %s was preempted for lack of KV cache space and will be recomputed (%d preemptions so "
                "far). Give the cache more room with kv_cache_memory (or VLLM_CPU_KVCACHE_SPACE) on CPU, "
                "gpu_memory_utilization on GPU, or lower max_num_seqs.", request.request_id, self.num_preemptions)

    def update_from_output(self, output: SchedulerOutput, sampled_token_ids: dict[str, int]) -> None:
        """Advance computed counts by the step's tokens and append each sampled token."""
        for request, num_new in output.scheduled:
            request.num_computed_tokens += num_new
            token = sampled_token_ids.get(request.request_id)
            if token is not None:
                request.append_output_token(token)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """Finish (stop, cap or abort) requests wherever they are; unknown or finished ids are ignored."""
        finished = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None or request.is_finished:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            self._finish(request, status)
            finished.append(request)
        return finished

    def _finish(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        self.kv_cache.free(request)
        self.requests.pop(request.request_id, None)
        self._finished_req_ids.add(request.request_id)
