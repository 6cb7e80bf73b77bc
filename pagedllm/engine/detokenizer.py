"""Incremental detokenization: text grows one token at a time, never ending in half a character."""
from __future__ import annotations

from typing import Any

# Prompt tokens decoded along with the first outputs, so the first word gets its leading space right.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Decodes a window that starts a few tokens back and emits what it adds to the previous window."""

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool,
                 spaces_between_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.token_ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)
        self.decode_kwargs = {"skip_special_tokens": skip_special_tokens}
        if spaces_between_special_tokens is False:
            self.decode_kwargs["spaces_between_special_tokens"] = False
        self.prefix_text = self._decode(self.prefix_offset, self.read_offset)

    def _decode(self, start: int, end: int) -> str:
        return self.tokenizer.decode(self.token_ids[start:end], **self.decode_kwargs)

    def add_token(self, token_id: int) -> str:
        """The new text this token completes ("" while a character is still incomplete)."""
        self.token_ids.append(token_id)
        text = self._decode(self.prefix_offset, len(self.token_ids))
        if len(text) <= len(self.prefix_text) or text.endswith("\ufffd"):
            return ""
        new_text = text[len(self.prefix_text):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        self.prefix_text = self._decode(self.prefix_offset, self.read_offset)
        return new_text
