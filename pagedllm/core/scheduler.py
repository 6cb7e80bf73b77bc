"""Iteration-level scheduling: each step, which requests compute how many of their tokens.

A request knows how many of its tokens exist and how many are computed; every step hands out tokens
within a budget so that the second count catches up with the first. That covers chunked prefill (a long
prompt takes several steps), prefix-cache hits (counted as computed on admission) and preemption by
recompute (the count drops to zero). With speculative decoding a decoding request's proposed tokens are
scheduled after its last one and verified in the same step; rejected ones are taken back from the computed
count in `update_from_output`. With multi-step (`num_scheduler_steps` > 1) a step of decodes only is
scheduled once for several tokens: each decode reserves slots for all of them, the worker samples them one
forward pass at a time, and they come back like accepted proposals.

One step, in order:
1. Under the priority policy, running requests worse than the best waiting one are preempted while that
   one cannot be admitted.
2. Running requests (decodes before partial prefills) get their tokens; when the cache has no room for
   one, the newest running request (under priority: the worst) is preempted, by recompute or by swap.
3. In a step that preempted nothing for lack of room, swapped-out requests come back, then waiting
   requests are admitted (never ahead of a swapped-out request that comes first), each while the token
   budget, `max_num_seqs` and the free blocks beyond the watermark last.
"""
from __future__ import annotations

import bisect
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Optional

from pagedllm.config import SchedulerConfig
from pagedllm.core.kv_cache import KVCacheManager, PrefixHit
from pagedllm.core.request import Request, RequestStatus
from pagedllm.core.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput

logger = logging.getLogger(__name__)
PREEMPTION_WARNING_INTERVAL = 50


@dataclass
class _Plan:
    """The step being planned, with the scheduler's own objects; `SchedulerOutput` is what leaves."""

    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, tokens this step)
    preempted: list[Request] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    decode_steps: dict[str, int] = field(default_factory=dict)  # multi-step: running decodes' tokens this step


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache: KVCacheManager, virtual_engine: int = 0) -> None:
        self.config = config
        self.virtual_engine = virtual_engine
        self.kv_cache = kv_cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self._priority = config.policy == "priority"
        self._swap = config.preemption_mode == "swap"
        self._finished_req_ids: set[str] = set()
        self._speculate = False  # whether this step verifies and proposes tokens (spec_decode)

    def add_request(self, request: Request) -> None:
        self._enqueue(self.waiting, request)
        self.requests[request.request_id] = request

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def _key(self, request: Request) -> tuple[float, ...]:
        """Queue order: lower first."""
        return (request.priority, request.arrival_time) if self._priority else (request.arrival_time,)

    def _enqueue(self, queue: deque[Request], request: Request, front: bool = False) -> None:
        """FCFS waiting: arrival order, preempted ones at the front; otherwise ordered by key."""
        if queue is self.waiting and not self._priority:
            queue.appendleft(request) if front else queue.append(request)
        elif front:
            bisect.insort_left(queue, request, key=self._key)
        else:
            bisect.insort_right(queue, request, key=self._key)

    # --- the step -----------------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = _Plan()
        budget = self.config.max_num_batched_tokens
        limit = self.config.speculative_disable_by_batch_size
        self._speculate = self.config.num_speculative_tokens > 0 and (limit is None or len(self.running) < limit)
        if self._priority:
            self._preempt_for_waiting(out, budget)
        num_preempted = len(out.preempted)
        budget = self._schedule_running(out, budget)
        if len(out.preempted) == num_preempted:
            if not out.blocks_to_swap_out:
                budget = self._schedule_swapped(out, budget)
            self._schedule_waiting(out, budget)
        return self._output(out)

    def _output(self, plan: _Plan) -> SchedulerOutput:
        """The plan as plain data for the workers: requests they do not hold whole, the others' changes."""
        out = SchedulerOutput(blocks_to_swap_out=plan.blocks_to_swap_out, blocks_to_swap_in=plan.blocks_to_swap_in,
                              preempted_req_ids=[r.request_id for r in plan.preempted],
                              virtual_engine=self.virtual_engine,
                              num_lookahead_tokens=self.config.num_speculative_tokens if self._speculate else 0)
        if len(plan.decode_steps) == len(plan.scheduled):  # a step with a prefill or a swap-in runs once
            out.decode_steps = plan.decode_steps
        for request, num_new in plan.scheduled:
            out.num_scheduled_tokens[request.request_id] = num_new
            if request.spec_token_ids:
                out.scheduled_spec_tokens[request.request_id] = list(request.spec_token_ids)
            if request.num_tokens_sent == 0:
                out.new_requests.append(NewRequestData(
                    request.request_id, list(request.prompt_token_ids), list(request.output_token_ids),
                    request.sampling_params, request.eos_token_id, list(request.block_ids),
                    request.num_computed_tokens, request.lora_request, request.prompt_embeds))
            else:
                out.cached_requests.append(CachedRequestData(
                    request.request_id, request.all_token_ids[request.num_tokens_sent:],
                    request.block_ids[request.num_blocks_sent:], request.num_computed_tokens,
                    request.num_blocks_sent))
            request.num_tokens_sent, request.num_blocks_sent = request.num_tokens, len(request.block_ids)
        out.finished_req_ids, self._finished_req_ids = self._finished_req_ids, set()
        return out

    def _num_new_tokens(self, request: Request, budget: int, num_computed: int) -> int:
        num_new = request.num_tokens - num_computed
        if num_new > budget:
            return budget if self.config.enable_chunked_prefill else 0
        return num_new

    def _schedule_running(self, out: _Plan, budget: int) -> int:
        """Decodes first, then partial prefills; preempt when the cache has no room."""
        order = sorted(self.running, key=lambda r: r.num_tokens - r.num_computed_tokens > 1)
        scheduled: set[str] = set()
        for request in order:
            if budget == 0:
                break
            if request.status != RequestStatus.RUNNING:  # preempted earlier in this loop
                continue
            num_new = self._num_new_tokens(request, budget, request.num_computed_tokens)
            if num_new == 1:
                num_new += self._drafts_to_verify(request, budget - 1)
            steps = self._decode_steps(request, num_new)
            if num_new == 0 or not self._allocate_or_preempt(request, num_new, scheduled, out, steps - 1):
                continue
            if steps > 1:
                out.decode_steps[request.request_id] = steps
            scheduled.add(request.request_id)
            out.scheduled.append((request, num_new))
            budget -= num_new
        return budget

    def _drafts_to_verify(self, request: Request, budget: int) -> int:
        """Keep as many of a decoding request's proposed tokens as this step verifies: within the budget, and
        never more than the request may still emit (max_tokens, max_model_len) less the target's own token."""
        params = request.sampling_params
        room = min(budget, self.config.max_model_len - request.num_tokens - 1)
        if params.max_tokens is not None:
            room = min(room, params.max_tokens - request.num_output_tokens - 1)
        if not self._speculate:
            room = 0
        del request.spec_token_ids[max(0, room):]
        return len(request.spec_token_ids)

    def _lookahead(self) -> int:
        return self.config.num_lookahead_slots if self._speculate else 0

    def _decode_steps(self, request: Request, num_new: int) -> int:
        """Multi-step: the tokens a running request whose last token alone is scheduled samples in this step,
        never more than it may still emit (max_tokens, max_model_len); 1 otherwise."""
        if not self.config.is_multi_step or num_new != 1 or request.num_computed_tokens + 1 != request.num_tokens:
            return 1
        steps = min(self.config.num_scheduler_steps, self.config.max_model_len - request.num_tokens)
        if request.sampling_params.max_tokens is not None:
            steps = min(steps, request.sampling_params.max_tokens - request.num_output_tokens)
        return max(1, steps)

    def _allocate_or_preempt(self, request: Request, num_new: int, scheduled: set[str],
                             out: _Plan, num_fed_back: int = 0) -> bool:
        """Find room for `request` (and the `num_fed_back` tokens a multi-step group computes after its
        scheduled one) by preempting requests not yet scheduled this step; False if it was itself preempted."""
        lookahead = self._lookahead() + num_fed_back
        while not self.kv_cache.allocate_slots(request, num_new, num_lookahead_tokens=lookahead):
            victim = self._pick_victim([r for r in self.running if r.request_id not in scheduled])
            self._preempt(victim, out)
            if victim is request:
                return False
        return True

    def _pick_victim(self, candidates: list[Request]) -> Request:
        return max(candidates, key=self._key) if self._priority else candidates[-1]

    def _preempt_for_waiting(self, out: _Plan, budget: int) -> None:
        """Preempt the worst running requests while the best waiting one is better and has no room."""
        while self.waiting and self.running:
            head, victim = self.waiting[0], self._pick_victim(self.running)
            if self._key(victim) <= self._key(head) or not self.kv_cache.can_ever_fit(head.num_tokens):
                return
            hit = self.kv_cache.find_prefix(head)
            num_new = self._num_new_tokens(head, budget, hit.num_tokens)
            if (len(self.running) < self.config.max_num_seqs
                    and self.kv_cache.can_allocate(head, num_new, hit, reserve=True)):
                return
            self._preempt(victim, out)

    def _preempt(self, request: Request, out: _Plan) -> None:
        self.running.remove(request)
        out.preempted.append(request)
        request.num_tokens_sent = request.num_blocks_sent = 0  # workers drop it; resuming sends it whole
        request.spec_token_ids = []
        pairs = self.kv_cache.swap_out(request) if self._swap else None
        if pairs is not None:
            out.blocks_to_swap_out.extend(pairs)
            request.status = RequestStatus.SWAPPED
            self._enqueue(self.swapped, request)
        else:
            self.kv_cache.free(request)
            request.num_computed_tokens = 0
            request.status = RequestStatus.PREEMPTED
            self._enqueue(self.waiting, request, front=True)
        self.num_preemptions += 1
        if self.num_preemptions % PREEMPTION_WARNING_INTERVAL == 1:
            logger.warning(
                "Sequence group %s is preempted by %s mode because there is not enough KV cache space. This can "
                "affect the end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to "
                "provide more KV cache memory (on CPU: kv_cache_memory or VLLM_CPU_KVCACHE_SPACE; or lower "
                "max_num_seqs). total_num_cumulative_preemption=%d", request.request_id,
                "PreemptionMode.SWAP" if pairs is not None else "PreemptionMode.RECOMPUTE", self.num_preemptions)

    def _swapped_first(self) -> bool:
        """Whether the swapped-out queue goes before the waiting one this turn."""
        if not self.swapped:
            return False
        return not (self._priority and self.waiting) or self._key(self.swapped[0]) <= self._key(self.waiting[0])

    def _has_room_for_another(self, budget: int) -> bool:
        return budget > 0 and len(self.running) < self.config.max_num_seqs

    def _schedule_swapped(self, out: _Plan, budget: int) -> int:
        while self._swapped_first() and self._has_room_for_another(budget):
            request = self.swapped[0]
            if self._ignore_if_never_fits(self.swapped, out):
                continue
            if not self._lora_fits(request):
                break
            num_new = self._num_new_tokens(request, budget, request.num_computed_tokens)
            pairs = self.kv_cache.swap_in(request, num_new + self._lookahead()) if num_new else None
            if pairs is None:
                break
            out.blocks_to_swap_in.extend(pairs)
            budget = self._start_running(self.swapped, num_new, out, budget)
        return budget

    def _schedule_waiting(self, out: _Plan, budget: int) -> int:
        held_back: list[Request] = []  # their LoRA adapter would exceed max_loras this step: they keep their place
        while self.waiting and not self._swapped_first() and self._has_room_for_another(budget):
            request = self.waiting[0]
            if self._ignore_if_never_fits(self.waiting, out):
                continue
            if not self._lora_fits(request):
                held_back.append(self.waiting.popleft())
                continue
            hit = self.kv_cache.find_prefix(request)
            num_new = self._num_new_tokens(request, budget, hit.num_tokens)
            if num_new == 0 or not self.kv_cache.allocate_slots(request, num_new, hit, reserve=True,
                                                                num_lookahead_tokens=self._lookahead()):
                break
            self._take_hit(request, hit)
            budget = self._start_running(self.waiting, num_new, out, budget)
        self.waiting.extendleft(reversed(held_back))
        return budget

    def _lora_fits(self, request: Request) -> bool:
        """Whether the running requests' LoRA adapters and this request's are at most max_loras."""
        if request.lora_request is None:
            return True
        running = {r.lora_request.lora_int_id for r in self.running if r.lora_request is not None}
        return request.lora_request.lora_int_id in running or len(running) < self.config.max_loras

    def _take_hit(self, request: Request, hit: PrefixHit) -> None:
        request.num_computed_tokens = hit.num_tokens
        if request.status == RequestStatus.WAITING:  # first scheduling; a preempted one keeps its count
            request.num_cached_tokens = hit.num_tokens

    def _start_running(self, queue: deque[Request], num_new: int, out: _Plan, budget: int) -> int:
        request = queue.popleft()
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        out.scheduled.append((request, num_new))
        return budget - num_new

    def _ignore_if_never_fits(self, queue: deque[Request], out: _Plan) -> bool:
        """Finish the head of `queue` if the whole cache could never hold it."""
        request = queue[0]
        if self.kv_cache.can_ever_fit(request.num_tokens):
            return False
        logger.warning("Request %s needs %d tokens of KV cache but the cache holds only %d; it is finished "
                       "without further output.", request.request_id, request.num_tokens,
                       (self.kv_cache.num_blocks - self.kv_cache.watermark_blocks) * self.kv_cache.block_size)
        queue.popleft()
        self._finish(request, RequestStatus.FINISHED_IGNORED)  # the engine finds it among finished_req_ids
        return True

    # --- after the step -----------------------------------------------------------------------------------

    def update_from_output(self, output: SchedulerOutput, sampled_token_ids: dict[str, list[int]],
                           draft_token_ids: Optional[dict[str, list[int]]] = None) -> None:
        """Advance computed counts by the step's tokens and append the sampled ones (requests finished while
        the step ran are left as they are). Proposed tokens that were rejected are no longer computed: their
        slots are written again by the next step, and blocks past the request's tokens (reserved for rejected
        proposals or lookahead) are freed. A multi-step group's tokens but the last were computed as inputs after
        the scheduled one (the same count with no proposals). `draft_token_ids` are the proposals to verify
        next."""
        for request_id, num_new in output.num_scheduled_tokens.items():
            request = self.requests.get(request_id)
            if request is None:
                continue
            request.num_computed_tokens += num_new
            tokens = sampled_token_ids.get(request_id)
            if tokens:
                num_rejected = len(output.scheduled_spec_tokens.get(request_id, ())) + 1 - len(tokens)
                request.num_computed_tokens -= num_rejected
                for token in tokens:
                    request.append_output_token(token)
                self.kv_cache.free_past(request, request.num_tokens)
                request.num_blocks_sent = min(request.num_blocks_sent, len(request.block_ids))
            request.spec_token_ids = list((draft_token_ids or {}).get(request_id, ()))

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """Finish (stop, cap or abort) requests wherever they are; unknown or finished ids are ignored."""
        finished = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None or request.is_finished:
                continue
            queues = {RequestStatus.RUNNING: self.running, RequestStatus.SWAPPED: self.swapped}
            queues.get(request.status, self.waiting).remove(request)
            self._finish(request, status)
            finished.append(request)
        return finished

    def _finish(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        self.kv_cache.free(request)
        self.requests.pop(request.request_id, None)
        self._finished_req_ids.add(request.request_id)
