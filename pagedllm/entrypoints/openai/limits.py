"""The limits a server puts on its users: how many requests may wait, for how long, and how long a prompt
may be before it is tokenized."""
from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import AsyncIterator, Optional, TypeVar

from pagedllm.entrypoints.openai.errors import APIError

T = TypeVar("T")
RETRY_AFTER_S = 1


class Admission:
    """Counts the engine requests in flight; beyond `capacity` a new request is refused with 503."""

    def __init__(self, capacity: Optional[int]) -> None:
        self.capacity = capacity
        self.in_flight = 0

    def admit(self, count: int) -> None:
        if self.capacity is not None and count > self.capacity:
            raise APIError(f"The request asks for {count} sequences (prompts times n), more than the server's "
                           f"capacity of {self.capacity}.", param="n")
        if self.capacity is not None and self.in_flight + count > self.capacity:
            raise APIError(f"The server is at capacity ({self.in_flight} requests in flight); retry later.",
                           HTTPStatus.SERVICE_UNAVAILABLE, headers={"Retry-After": str(RETRY_AFTER_S)})
        self.in_flight += count

    async def holding(self, items: AsyncIterator[T], count: int) -> AsyncIterator[T]:
        """Yield from `items`; the `count` admitted requests are released when it ends, however it ends."""
        try:
            async for item in items:
                yield item
        finally:
            self.in_flight -= count


@dataclass(frozen=True)
class PromptLimit:
    """A text prompt longer than `max_chars` cannot fit in the context, whatever its tokens: refuse it
    before spending time tokenizing it."""

    max_chars: int

    @classmethod
    def for_tokenizer(cls, tokenizer: object, max_model_len: int) -> "PromptLimit":
        # A token's text is never longer than its vocabulary entry (byte-level BPE spells each byte as one
        # character), so max_model_len times the longest entry bounds the text of any prompt that fits.
        longest = max((len(token) for token in tokenizer.get_vocab()), default=1)  # type: ignore[attr-defined]
        return cls(max_model_len * longest)

    def check(self, text: str, param: str) -> None:
        if len(text) > self.max_chars:
            raise APIError(f"The prompt is {len(text)} characters long, more than the {self.max_chars} that "
                           "can fit in this model's maximum context length.", param=param)
