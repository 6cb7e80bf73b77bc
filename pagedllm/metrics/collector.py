"""Per-request timing and per-step counting: fills each request's `RequestMetrics` and builds `Stats`.

The engine calls it at three points of a step: after scheduling, when the step's tokens are known, and
for each request that finished. Timestamps are written into the request's `RequestMetrics` (the object its
`RequestOutput`s carry), so what the loggers and the trace spans report is what the user sees there.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterable

from pagedllm.core.request import Request
from pagedllm.core.scheduler import Scheduler
from pagedllm.metrics.stats import SpecDecodeStats, Stats
from pagedllm.outputs import RequestMetrics

Tracked = tuple[Request, RequestMetrics]  # a request and the metrics its outputs carry


class StatsCollector:
    def __init__(self, schedulers: list[Scheduler], collect: bool, max_lora: int = 0,
                 num_speculative_tokens: int = 0) -> None:
        """`schedulers`: one per virtual engine; `collect` says whether to gather `Stats` at all (request
        metrics are filled either way)."""
        self.schedulers = schedulers
        self.collect = collect
        self.max_lora = max_lora
        self.spec_decode = SpecDecodeStats(num_speculative_tokens) if num_speculative_tokens else None
        self.on_finished_hooks: list[Callable[[Request, RequestMetrics], None]] = []
        self._stats = Stats(now=time.time())
        self._preemptions_seen = self._num_preemptions()

    def on_schedule(self, scheduled: Iterable[RequestMetrics], scheduler_time: float) -> None:
        """Mark the step's requests as scheduled and charge them the time `schedule()` took."""
        now = time.time()
        for metrics in scheduled:
            metrics.scheduler_time = (metrics.scheduler_time or 0.0) + scheduler_time
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
                metrics.time_in_queue = now - metrics.arrival_time

    def on_tokens(self, scheduled: Iterable[Tracked], num_new_tokens: dict[str, int], execute_time: float,
                  forward_time_ms: float, now: float, per_token: bool = False) -> None:
        """Record the step's new tokens, those the output processor kept (id -> count), which arrived at
        `now`: first-token and per-token latencies, token counts, model time. With `per_token` (a multi-step
        group, whose tokens vLLM takes one step each) each token is one time per output token, an equal share
        of the group's."""
        stats = self._stats
        for request, metrics in scheduled:
            metrics.model_execute_time = (metrics.model_execute_time or 0.0) + execute_time
            metrics.model_forward_time = (metrics.model_forward_time or 0.0) + forward_time_ms
            if request.request_id not in num_new_tokens:
                continue
            if metrics.first_token_time is None:
                metrics.first_token_time = now
                if self.collect:
                    stats.time_to_first_tokens_iter.append(now - metrics.arrival_time)
                    stats.num_prompt_tokens_iter += request.num_prompt_tokens
            elif self.collect:
                shares = num_new_tokens[request.request_id] if per_token else 1
                stats.time_per_output_tokens_iter.extend([(now - metrics.last_token_time) / shares] * shares)
            metrics.last_token_time = now
        if self.collect:
            stats.num_generation_tokens_iter += sum(num_new_tokens.values())

    def on_spec_tokens(self, scheduled: Iterable[Tracked], proposed: dict[str, list[int]],
                       sampled_token_ids: dict[str, list[int]]) -> None:
        """Count a step's verified proposals: totals and each request's acceptance counts."""
        totals = self.spec_decode
        for request, metrics in scheduled:
            num_proposed = len(proposed.get(request.request_id, ()))
            tokens = sampled_token_ids.get(request.request_id)
            if not num_proposed or not tokens:
                continue
            num_accepted = len(tokens) - 1
            totals.draft_tokens += num_proposed
            totals.accepted_tokens += num_accepted
            totals.emitted_tokens += len(tokens)
            totals.max_emitted_tokens += num_proposed + 1
            counts = metrics.spec_token_acceptance_counts
            if counts is None:
                counts = metrics.spec_token_acceptance_counts = [0] * (totals.num_spec_tokens + 1)
            for i in range(num_accepted + 1):
                counts[i] += 1

    def on_pooled(self, scheduled: Iterable[Tracked], execute_time: float, forward_time_ms: float) -> None:
        """Record a pooling step: each request finishes in its one pass, whose end stands for its first and
        last token; its prompt tokens count as a prefill's do."""
        now = time.time()
        for request, metrics in scheduled:
            metrics.model_execute_time = (metrics.model_execute_time or 0.0) + execute_time
            metrics.model_forward_time = (metrics.model_forward_time or 0.0) + forward_time_ms
            metrics.first_token_time = metrics.last_token_time = metrics.finished_time = now
            if self.collect:
                self._stats.num_prompt_tokens_iter += request.num_prompt_tokens

    def on_finished(self, request: Request, metrics: RequestMetrics) -> None:
        """Record a request that finished (stopped, capped or never fit); aborted ones are not counted."""
        if self.collect:
            self._add_finished(request, metrics)
        for hook in self.on_finished_hooks:
            hook(request, metrics)

    def _add_finished(self, request: Request, metrics: RequestMetrics) -> None:
        stats = self._stats
        finished = metrics.finished_time or time.time()
        scheduled = metrics.first_scheduled_time or finished
        first_token = metrics.first_token_time or finished
        params = request.sampling_params
        stats.time_e2e_requests.append(finished - metrics.arrival_time)
        stats.time_queue_requests.append(scheduled - metrics.arrival_time)
        stats.time_inference_requests.append(finished - scheduled)
        stats.time_prefill_requests.append(first_token - scheduled)
        stats.time_decode_requests.append(finished - first_token)
        stats.num_prompt_tokens_requests.append(request.num_prompt_tokens)
        stats.num_generation_tokens_requests.append(request.num_output_tokens)
        stats.max_num_generation_tokens_requests.append(request.num_output_tokens)
        stats.n_requests.append(getattr(params, "n", 1))  # a pooling request is one sequence without max_tokens
        if getattr(params, "max_tokens", None) is not None:
            stats.max_tokens_requests.append(params.max_tokens)
        stats.finished_reason_requests.append(request.status.finish_reason)

    def make_stats(self) -> Stats:
        """The system state now plus everything recorded since the previous call."""
        stats, self._stats = self._stats, Stats(now=time.time())
        schedulers = self.schedulers
        stats.now = time.time()
        # Virtual engines have caches of one size: usage and hit rates are their means.
        caches = [scheduler.kv_cache for scheduler in schedulers]
        stats.num_running_sys = sum(len(scheduler.running) for scheduler in schedulers)
        stats.num_waiting_sys = sum(len(scheduler.waiting) for scheduler in schedulers)
        stats.num_swapped_sys = sum(len(scheduler.swapped) for scheduler in schedulers)
        stats.gpu_cache_usage_sys = sum(kv_cache.usage for kv_cache in caches) / len(caches)
        stats.cpu_cache_usage_sys = sum(kv_cache.swap_usage for kv_cache in caches) / len(caches)
        stats.gpu_prefix_cache_hit_rate = sum(c.prefix_cache_stats.hit_rate for c in caches) / len(caches)
        preemptions = self._num_preemptions()
        stats.num_preemption_iter, self._preemptions_seen = preemptions - self._preemptions_seen, preemptions
        stats.running_lora_adapters = _lora_names(r for scheduler in schedulers for r in scheduler.running)
        stats.waiting_lora_adapters = _lora_names(r for scheduler in schedulers for r in scheduler.waiting)
        stats.max_lora = str(self.max_lora)
        if self.spec_decode is not None:
            stats.spec_decode_metrics = dataclasses.replace(self.spec_decode)
        return stats

    def _num_preemptions(self) -> int:
        return sum(scheduler.num_preemptions for scheduler in self.schedulers)


def _lora_names(requests: Any) -> list[str]:
    return sorted({r.lora_request.lora_name for r in requests if r.lora_request is not None})

