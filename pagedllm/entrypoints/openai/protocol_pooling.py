"""Request and response bodies of the pooling endpoints (/v1/embeddings, /pooling, /classify, /score,
/rerank), as vLLM serves them."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field

from pagedllm.entrypoints.openai.protocol import (MAX_LIST, MAX_PROMPTS, Count, Int64, OpenAIBaseModel, ShortStr,
                                                  TokenIds, random_id, unix_time)

PoolingInput = Union[str, Annotated[list[str], Field(max_length=MAX_PROMPTS)], TokenIds,
                     Annotated[list[TokenIds], Field(max_length=MAX_PROMPTS)]]
Texts = Union[str, Annotated[list[str], Field(max_length=MAX_PROMPTS)]]
PositiveInt = Annotated[int, Field(ge=1, le=2**31)]


class PoolingUsage(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: Optional[int] = 0
    prompt_tokens_details: Optional[Any] = None


class EmbeddingRequest(OpenAIBaseModel):
    model: Optional[ShortStr] = None
    input: PoolingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[PositiveInt] = None
    user: Optional[ShortStr] = None
    truncate_prompt_tokens: Optional[PositiveInt] = None
    add_special_tokens: bool = True
    normalize: Optional[bool] = None
    priority: Int64 = 0
    request_id: ShortStr = Field(default_factory=random_id)


class EmbeddingData(OpenAIBaseModel):
    index: int
    object: str = "embedding"
    embedding: Union[list[float], str]


class EmbeddingResponse(OpenAIBaseModel):
    id: str
    object: str = "list"
    created: int = Field(default_factory=unix_time)
    model: str
    data: list[EmbeddingData]
    usage: PoolingUsage


class PoolingRequest(EmbeddingRequest):
    """/pooling: the model's pooled output as it is (`encode`), nested lists for per-token pooling."""


class PoolingData(OpenAIBaseModel):
    index: int
    object: str = "pooling"
    data: Union[list[Any], str]


class PoolingResponse(OpenAIBaseModel):
    id: str
    object: str = "list"
    created: int = Field(default_factory=unix_time)
    model: str
    data: list[PoolingData]
    usage: PoolingUsage


class ClassificationRequest(OpenAIBaseModel):
    model: Optional[ShortStr] = None
    input: Texts
    truncate_prompt_tokens: Optional[PositiveInt] = None
    activation: Optional[bool] = None  # a classifier's activation (softmax, or sigmoid for one label)
    user: Optional[ShortStr] = None
    priority: Int64 = 0
    request_id: ShortStr = Field(default_factory=random_id)


class ClassificationData(OpenAIBaseModel):
    index: int
    label: Optional[str]
    probs: list[float]
    num_classes: int


class ClassificationResponse(OpenAIBaseModel):
    id: str
    object: str = "list"
    created: int = Field(default_factory=unix_time)
    model: str
    data: list[ClassificationData]
    usage: PoolingUsage


class ScoreRequest(OpenAIBaseModel):
    model: Optional[ShortStr] = None
    text_1: Texts
    text_2: Texts
    truncate_prompt_tokens: Optional[PositiveInt] = None
    activation: Optional[bool] = None  # a classifier's activation (softmax, or sigmoid for one label)
    priority: Int64 = 0
    request_id: ShortStr = Field(default_factory=random_id)


class ScoreData(OpenAIBaseModel):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(OpenAIBaseModel):
    id: str
    object: str = "list"
    created: int = Field(default_factory=unix_time)
    model: str
    data: list[ScoreData]
    usage: PoolingUsage


class RerankRequest(OpenAIBaseModel):
    model: Optional[ShortStr] = None
    query: str
    documents: Annotated[list[str], Field(max_length=MAX_LIST)]
    top_n: Count = 0  # 0: every document
    truncate_prompt_tokens: Optional[PositiveInt] = None
    activation: Optional[bool] = None  # a classifier's activation (softmax, or sigmoid for one label)
    priority: Int64 = 0
    request_id: ShortStr = Field(default_factory=random_id)


class RerankDocument(OpenAIBaseModel):
    text: str


class RerankResult(OpenAIBaseModel):
    index: int
    document: RerankDocument
    relevance_score: float


class RerankUsage(OpenAIBaseModel):
    total_tokens: int


class RerankResponse(OpenAIBaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]
