"""The OpenAI API's request and response bodies (with vLLM's extra request fields), as pydantic models.

Every request field is range-checked here, before anything reaches the engine: integers the engine stores
fit in int64 (the seed as vLLM bounds it), floats are finite, and lists and strings have bounded lengths.
"""
from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_N = 128  # choices per prompt, as OpenAI allows
MAX_LIST = 1024  # stop strings, stop ids, bad words, guided choices, tools, messages' content parts
MAX_PROMPTS = 256  # prompts in one completion request
MAX_ID_CHARS = 256  # request ids, model and user names
MAX_MESSAGES = 4096  # messages in one conversation

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
TokenId = Annotated[int, Field(ge=0, le=INT64_MAX)]
TokenIds = Annotated[list[TokenId], Field(max_length=MAX_LIST)]
ShortStr = Annotated[str, Field(max_length=MAX_ID_CHARS)]


def random_id() -> str:
    return uuid.uuid4().hex


def unix_time() -> int:
    return int(time.time())


class OpenAIBaseModel(BaseModel):
    # Unknown fields are accepted and ignored, as OpenAI clients send fields this server does not know.
    # NaN and infinities (which Python's JSON parser accepts) would reach the sampler as they are.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


class StreamOptions(OpenAIBaseModel):
    include_usage: Optional[bool] = True
    continuous_usage_stats: Optional[bool] = False


class ResponseFormat(OpenAIBaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[dict[str, Any]] = None


class SamplingFields(OpenAIBaseModel):
    """The fields completions and chat share: OpenAI's, then vLLM's extras."""

    model: Optional[ShortStr] = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: Optional[Annotated[dict[str, float], Field(max_length=MAX_LIST)]] = None
    n: int = Field(default=1, le=MAX_N)  # below 1: SamplingParams' own (vLLM's) error
    seed: Optional[Int64] = None
    stop: Optional[Union[str, Annotated[list[str], Field(max_length=MAX_LIST)]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    user: Optional[ShortStr] = None
    response_format: Optional[ResponseFormat] = None
    # vLLM's extras
    best_of: Optional[int] = Field(default=None, le=MAX_N)
    top_k: Optional[Annotated[int, Field(ge=-1, le=INT64_MAX)]] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    stop_token_ids: Optional[TokenIds] = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: Count = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: Optional[int] = Field(default=None, ge=1, le=INT64_MAX)
    prompt_logprobs: Optional[Count] = None
    allowed_token_ids: Optional[TokenIds] = None
    bad_words: Optional[Annotated[list[str], Field(max_length=MAX_LIST)]] = None
    guided_json: Optional[Union[str, dict[str, Any]]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[Annotated[list[str], Field(max_length=MAX_LIST)]] = None
    guided_grammar: Optional[str] = None
    guided_decoding_backend: Optional[ShortStr] = None
    guided_whitespace_pattern: Optional[str] = None
    priority: Int64 = 0
    request_id: ShortStr = Field(default_factory=random_id)
    return_tokens_as_token_ids: bool = False


class CompletionRequest(SamplingFields):
    prompt: Union[str, Annotated[list[str], Field(max_length=MAX_PROMPTS)], list[TokenId],
                  Annotated[list[list[TokenId]], Field(max_length=MAX_PROMPTS)]]
    echo: bool = False
    logprobs: Optional[Count] = None
    max_tokens: Optional[int] = Field(default=16, ge=1, le=INT64_MAX)
    suffix: Optional[str] = None
    add_special_tokens: bool = True


class ChatMessage(OpenAIBaseModel):
    role: ShortStr
    content: Optional[Union[str, Annotated[list[dict[str, Any]], Field(max_length=MAX_LIST)]]] = None
    name: Optional[ShortStr] = None


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    logprobs: bool = False
    top_logprobs: Optional[Count] = 0
    max_tokens: Optional[int] = Field(default=None, ge=1, le=INT64_MAX)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1, le=INT64_MAX)
    tools: Optional[Annotated[list[dict[str, Any]], Field(max_length=MAX_LIST)]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = "none"
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: Optional[str] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogProbs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)


class CompletionChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[None, int, str] = None
    prompt_logprobs: Optional[list[Optional[dict[int, dict[str, Any]]]]] = None


class ResponseHeader(OpenAIBaseModel):
    """The fields every completion and chat body starts with; subclasses give `object` its value."""

    id: str
    object: str
    created: int = Field(default_factory=unix_time)
    model: str


class CompletionResponse(ResponseHeader):
    object: str = "text_completion"
    choices: list[CompletionChoice]
    usage: Optional[UsageInfo] = None


class CompletionChunk(CompletionResponse):
    """One streamed event; OpenAI gives it the same shape as the whole response."""


class TopLogprob(OpenAIBaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogProbs(OpenAIBaseModel):
    content: Optional[list[TokenLogprob]] = None


class AssistantMessage(OpenAIBaseModel):
    role: str = "assistant"
    content: Optional[str] = None


class DeltaMessage(OpenAIBaseModel):
    role: Optional[str] = None
    content: Optional[str] = None


class ChatChoice(OpenAIBaseModel):
    index: int
    message: AssistantMessage
    logprobs: Optional[ChatLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[None, int, str] = None


class ChatChunkChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChatLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[None, int, str] = None


class ChatCompletionResponse(ResponseHeader):
    object: str = "chat.completion"
    choices: list[ChatChoice]
    usage: UsageInfo


class ChatCompletionChunk(ResponseHeader):
    object: str = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Optional[UsageInfo] = None


class ModelCard(OpenAIBaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=unix_time)
    owned_by: str = "pagedllm"
    root: Optional[str] = None
    parent: Optional[str] = None
    max_model_len: Optional[int] = None


class ModelList(OpenAIBaseModel):
    object: str = "list"
    data: list[ModelCard]


class TokenizeRequest(OpenAIBaseModel):
    model: Optional[ShortStr] = None
    prompt: Optional[str] = None
    messages: Optional[Annotated[list[ChatMessage], Field(max_length=MAX_MESSAGES)]] = None
    add_special_tokens: Optional[bool] = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: Optional[list[str]] = None


class DetokenizeRequest(OpenAIBaseModel):
    model: Optional[ShortStr] = None
    tokens: list[TokenId]


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str
