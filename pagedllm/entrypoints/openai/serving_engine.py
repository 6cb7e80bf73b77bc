"""What every endpoint needs: the engine, the model's names and limits, tokenizing and chat rendering.

Tokenizing and rendering run in a thread pool: a long prompt must not stall the event loop that serves
every other client (the fast tokenizer releases the GIL while it encodes).
"""
from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, AsyncIterator, Callable, Optional, TypeVar, Union

from starlette.requests import Request

from pagedllm.entrypoints.openai.errors import APIError
from pagedllm.entrypoints.openai.limits import Admission, PromptLimit
from pagedllm.entrypoints.openai.protocol import ChatMessage
from pagedllm.entrypoints.openai.streams import until_disconnected
from pagedllm.entrypoints.openai.serving_lora import LoRAModules
from pagedllm.inputs import TokensPrompt
from pagedllm.lora.request import LoRARequest
from pagedllm.metrics.tracing import extract_trace_headers
from pagedllm.sampling_params import SamplingParams

T = TypeVar("T")
# Arguments of apply_chat_template that a request's chat_template_kwargs must not override.
_RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "tools", "documents", "chat_template", "add_generation_prompt", "continue_final_message",
    "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs"})


@dataclass
class ServingContext:
    """Built once when the server starts and shared by every endpoint."""

    engine: Any  # AsyncLLMEngine or MQLLMEngineClient
    served_model_names: list[str]
    tokenizer: Any
    max_model_len: int
    vocab_size: int
    default_params: SamplingParams
    chat_template: Optional[str]
    admission: Admission
    prompt_limit: PromptLimit
    request_timeout: Optional[float] = None
    trust_request_chat_template: bool = False
    pool: Optional[ThreadPoolExecutor] = None
    lora_modules: Optional[LoRAModules] = None


class OpenAIServing:
    """The shared state of the endpoints, and the steps every request goes through."""

    def __init__(self, context: ServingContext) -> None:
        self.context = context
        self.engine = context.engine
        self.served_model_names = context.served_model_names
        self.tokenizer = context.tokenizer
        self.max_model_len = context.max_model_len
        self.default_params = context.default_params
        self.chat_template = load_chat_template(context.chat_template)
        self.lora_modules = context.lora_modules

    @staticmethod
    def trace_headers(raw_request: Request) -> Optional[dict[str, str]]:
        """The W3C trace context the client sent, for the request's span."""
        return extract_trace_headers(raw_request.headers) or None

    def model_name(self, requested: Optional[str]) -> str:
        """The name to answer with (the model's, or a LoRA adapter's); an unknown model is a 404."""
        if requested is None:
            return self.served_model_names[0]
        if requested not in self.served_model_names and self.lora_request(requested) is None:
            raise APIError(f"The model `{requested}` does not exist.", HTTPStatus.NOT_FOUND, param="model")
        return requested

    def lora_request(self, requested: Optional[str]) -> Optional[LoRARequest]:
        """The adapter a request's `model` names, if it names one."""
        return self.lora_modules.get(requested) if self.lora_modules is not None else None

    async def _off_loop(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.context.pool, lambda: function(*args, **kwargs))

    async def tokenize(self, prompt: Union[str, list[int]], add_special_tokens: bool,
                       truncate_prompt_tokens: Optional[int] = None, param: str = "prompt") -> TokensPrompt:
        """Token ids (and text, when given) of one prompt, truncated from the left if asked."""
        if isinstance(prompt, str):
            if truncate_prompt_tokens is None:
                self.context.prompt_limit.check(prompt, param)
            token_ids = await self._off_loop(self.tokenizer.encode, prompt, add_special_tokens=add_special_tokens)
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

    def check_token_ids(self, token_ids: Optional[list[int]], param: str) -> None:
        """Token ids the engine indexes tensors with must be in the vocabulary."""
        bad = [t for t in token_ids or [] if t >= self.context.vocab_size]
        if bad:
            raise APIError(f"{param} contains token ids {bad[:5]} outside the vocabulary of size "
                           f"{self.context.vocab_size}.", param=param)

    async def render_chat(self, messages: list[ChatMessage], add_generation_prompt: bool,
                          continue_final_message: bool, chat_template: Optional[str] = None,
                          tools: Optional[list[dict[str, Any]]] = None,
                          chat_template_kwargs: Optional[dict[str, Any]] = None) -> str:
        """The conversation as prompt text, through the request's, the server's or the model's template."""
        if add_generation_prompt and continue_final_message:
            raise APIError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        if chat_template is not None and not self.context.trust_request_chat_template:
            raise APIError("This server does not accept `chat_template` in requests (start it with "
                           "--trust-request-chat-template to allow it).", param="chat_template")
        reserved = sorted(_RESERVED_TEMPLATE_KWARGS.intersection(chat_template_kwargs or {}))
        if reserved:
            raise APIError(f"chat_template_kwargs cannot set {reserved}.", param="chat_template_kwargs")
        conversation = [_plain_message(message) for message in messages]
        try:
            return await self._off_loop(
                self.tokenizer.apply_chat_template, conversation,
                chat_template=chat_template or self.chat_template, tokenize=False,
                add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
                tools=tools, **(chat_template_kwargs or {}))
        except Exception as error:  # the template (the model's, or the request's) refused these messages
            raise APIError(f"The chat template failed on these messages: {error}", param="messages") from None

    def outputs(self, stream: AsyncIterator[T], raw_request: Request, count: int) -> AsyncIterator[T]:
        """The engine's outputs for a request of `count` engine requests: admitted (or refused with 503 when
        too many wait), ended by the client leaving or by the request timeout."""
        self.context.admission.admit(count)
        watched = until_disconnected(stream, raw_request, self.context.request_timeout)
        return self.context.admission.holding(watched, count)


def _plain_message(message: ChatMessage) -> dict[str, Any]:
    """A message with its content as one string (text parts joined by newlines)."""
    content = message.content
    if isinstance(content, list):
        texts = []
        for part in content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(f"Unsupported content part of type {str(part.get('type'))[:40]!r}: only text parts "
                               "are supported.", param="messages")
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
