"""Sleep mode on the engine: `sleep(level)`, `wake_up(tags)`, `is_sleeping()` (with enable_sleep_mode=True).

The workers release the weights and the KV cache (worker/sleep.py); the engine refuses to sleep with requests
in flight, forgets its prefix cache (the blocks' contents are gone) and refuses new requests until every part
is awake again.
"""
from __future__ import annotations

from typing import Any, Optional

SLEEP_TAGS = ("weights", "kv_cache")


class EngineSleepingError(RuntimeError):
    """A request came while the engine sleeps; the server answers it with 503."""


class SleepRefusedError(RuntimeError):
    """sleep() cannot be done in the engine's present state (asleep already, requests in flight); the server
    answers it with 409."""


class SleepModeMixin:
    """LLMEngine's sleep calls; `_asleep` holds the parts (tags) that are asleep."""

    _asleep: frozenset[str] = frozenset()
    config: Any
    model_executor: Any
    schedulers: list

    def sleep(self, level: int = 1) -> None:
        """Level 1: the weights go to a host copy (a file on CPU, so resident memory drops) and the KV cache
        is dropped; level 2: both are dropped and the weights reload from the model's files on waking."""
        if not self.config.model_config.enable_sleep_mode:
            raise ValueError("Sleep mode is not enabled in the model config")
        if level not in (1, 2):
            raise ValueError(f"Sleep level must be 1 or 2, got {level!r}.")
        if self._asleep:
            raise SleepRefusedError("The engine is already sleeping; call wake_up() first.")
        unfinished = self.get_num_unfinished_requests()
        if unfinished:
            raise SleepRefusedError(f"Cannot sleep with {unfinished} unfinished request(s); finish or abort them "
                                    "first.")
        for scheduler in self.schedulers:
            scheduler.kv_cache.reset_prefix_cache()
        self.model_executor.sleep(level)
        self._asleep = frozenset(SLEEP_TAGS)

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """Restore the parts `tags` names ("weights", "kv_cache"; all when None)."""
        if not self.config.model_config.enable_sleep_mode:
            raise ValueError("Sleep mode is not enabled in the model config")
        unknown = set(tags or ()) - set(SLEEP_TAGS)
        if unknown:
            raise ValueError(f"Unknown wake_up tags {sorted(unknown)}; valid tags are {list(SLEEP_TAGS)}.")
        self.model_executor.wake_up(list(tags) if tags is not None else None)
        self._asleep -= set(tags or SLEEP_TAGS)

    def is_sleeping(self) -> bool:
        return bool(self._asleep)

    def _check_awake(self) -> None:
        if self._asleep:
            raise EngineSleepingError(f"The engine is sleeping ({', '.join(sorted(self._asleep))} released); call "
                               "wake_up() before adding requests.")
