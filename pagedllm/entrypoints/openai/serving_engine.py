"""What every endpoint needs: the engine, the model's names and limits, tokenizing and chat rendering."""
from __future__ import annotations

import os
from http import HTTPStatus
from typing import Any, Optional, Union

import jinja2
from starlette.requests import Request

from pagedllm.engine.async_engine import AsyncLLMEngine
from pagedllm.entrypoints.openai.errors import APIError
from pagedllm.entrypoints.openai.protocol import ChatMessage
from pagedllm.inputs import TokensPrompt
from pagedllm.metrics.tracing import extract_trace_headers
from pagedllm.sampling_params import SamplingParams


class OpenAIServing:
    """Shared state of the endpoints; built once when the server starts."""

    def __init__(self, engine: AsyncLLMEngine, served_model_names: list[str], tokenizer: Any,
                 max_model_len: int, default_params: SamplingParams, chat_template: Optional[str]) -> None:
        self.engine = engine
        self.served_model_names = served_model_names
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.default_params = default_params
        self.chat_template = load_chat_template(chat_template)

    @staticmethod
    def trace_headers(raw_request: Request) -> Optional[dict[str, str]]:
        """The W3C trace context the client sent, for the request's span."""
        return extract_trace_headers(raw_request.headers) or None

    def model_name(self, requested: Optional[str]) -> str:
        """The name to answer with; an unknown model is a 404."""
        if requested is None:
            return self.served_model_names[0]
        if requested not in self.served_model_names:
            raise APIError(f"The model `{requested}` does not exist.", HTTPStatus.NOT_FOUND, param="model")
        return requested

    def tokenize(self, prompt: Union[str, list[int]], add_special_tokens: bool,
                 truncate_prompt_tokens: Optional[int] = None) -> TokensPrompt:
        """Token ids (and text, when given) of one prompt, truncated from the left if asked."""
        if isinstance(prompt, str):
            token_ids = self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        else:
            token_ids = list(prompt)
        if truncate_prompt_tokens is not None:
            token_ids = token_ids[-truncate_prompt_tokens:]
        tokens = TokensPrompt(prompt_token_ids=token_ids)
        if isinstance(prompt, str):
            tokens["prompt"] = prompt
        return tokens

    def max_tokens(self, num_prompt_tokens: int, requested: Optional[int]) -> int:
        """The output budget; a prompt and budget beyond the context length is a 400."""
        room = self.max_model_len - num_prompt_tokens
        if requested is None:
            requested = room
        if num_prompt_tokens + requested > self.max_model_len:
            raise APIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{num_prompt_tokens + requested} tokens ({num_prompt_tokens} in the prompt, {requested} in the "
                "completion). Please reduce the length of the prompt or completion.", param="max_tokens")
        return requested

    def render_chat(self, messages: list[ChatMessage], add_generation_prompt: bool,
                    continue_final_message: bool, chat_template: Optional[str] = None,
                    tools: Optional[list[dict[str, Any]]] = None,
                    chat_template_kwargs: Optional[dict[str, Any]] = None) -> str:
        """The conversation as prompt text, through the request's, the server's or the model's template."""
        if add_generation_prompt and continue_final_message:
            raise APIError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        conversation = [_plain_message(message) for message in messages]
        try:
            return self.tokenizer.apply_chat_template(
                conversation, chat_template=chat_template or self.chat_template, tokenize=False,
                add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
                tools=tools, **(chat_template_kwargs or {}))
        except jinja2.TemplateError as error:
            raise APIError(f"The chat template failed on these messages: {error}", param="messages") from None


def _plain_message(message: ChatMessage) -> dict[str, Any]:
    """A message with its content as one string (text parts joined by newlines)."""
    content = message.content
    if isinstance(content, list):
        texts = []
        for part in content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(f"Unsupported content part of type {part.get('type')!r}: only text parts are "
                               "supported.", param="messages")
            texts.append(part["text"])
        content = "\n".join(texts)
    plain: dict[str, Any] = {"role": message.role, "content": content or ""}
    if message.name is not None:
        plain["name"] = message.name
    return plain


def load_chat_template(template: Optional[str]) -> Optional[str]:
    """`--chat-template` is a file path or the template text itself."""
    if template is None or not os.path.isfile(template):
        return template
    with open(template, encoding="utf-8") as f:
        return f.read()
