"""Prompt forms accepted by the engine, and their parsing into one shape."""
from __future__ import annotations

from typing import Any, NamedTuple, Optional, TypedDict, Union

from typing_extensions import NotRequired


class TextPrompt(TypedDict):
    prompt: str
    multi_modal_data: NotRequired[Any]


class TokensPrompt(TypedDict):
    prompt_token_ids: list[int]
    prompt: NotRequired[str]
    token_type_ids: NotRequired[list[int]]  # an encoder's token types (a text pair's second text is type 1)
    multi_modal_data: NotRequired[Any]


class EmbedsPrompt(TypedDict):
    prompt_embeds: Any


PromptType = Union[str, TextPrompt, TokensPrompt, EmbedsPrompt]


class ParsedPrompt(NamedTuple):
    """A prompt after parsing: exactly one of text, token ids or embeddings is the source; token ids may come
    with their token types."""

    text: Optional[str]
    token_ids: Optional[list[int]]
    embeds: Any = None
    token_type_ids: Optional[list[int]] = None


def checked_prompt_embeds(embeds: Any, hidden_size: int, enabled: bool) -> Any:
    """A prompt's embeddings as the workers take them (detached, on the CPU), after checking that the engine
    takes embeddings and that they are a float tensor of shape (prompt length, hidden_size)."""
    if not enabled:
        raise ValueError("Prompt embeddings need enable_prompt_embeds=True (prompt_embeds was given).")
    shape = tuple(getattr(embeds, "shape", ()))
    if len(shape) != 2 or shape[1] != hidden_size or not embeds.is_floating_point():
        raise ValueError(f"prompt_embeds must be a float tensor of shape (prompt length, {hidden_size}), "
                         f"got {type(embeds).__name__} of shape {shape}.")
    return embeds.detach().to("cpu").contiguous()


def parse_prompt(prompt: PromptType) -> ParsedPrompt:
    """Normalise the accepted prompt forms; anything else is a TypeError naming what was given (multimodal data,
    which no model here reads, a ValueError)."""
    if isinstance(prompt, str):
        return ParsedPrompt(prompt, None)
    if isinstance(prompt, dict):
        if prompt.get("multi_modal_data") is not None:
            raise ValueError("multi_modal_data is not supported by pagedllm: its models take text only.")
        if "prompt_token_ids" in prompt:
            ids, types = prompt["prompt_token_ids"], prompt.get("token_type_ids")
            for name, value in (("prompt_token_ids", ids), ("token_type_ids", [] if types is None else types)):
                if not isinstance(value, (list, tuple)) or not all(isinstance(t, int) for t in value):
                    raise TypeError(f"{name} must be a list of integers.")
            return ParsedPrompt(prompt.get("prompt"), list(ids), None, None if types is None else list(types))
        if "prompt_embeds" in prompt:
            return ParsedPrompt(None, None, prompt["prompt_embeds"])
        if "prompt" in prompt and isinstance(prompt["prompt"], str):
            return ParsedPrompt(prompt["prompt"], None)
    raise TypeError(f"Unsupported prompt of type {type(prompt).__name__}: expected a string, "
                    "{'prompt': str}, {'prompt_token_ids': [...]} or {'prompt_embeds': tensor}.")
