"""What the engine returns: RequestOutput, CompletionOutput, Logprob, RequestMetrics, and pooling outputs
(PoolingRequestOutput with its embedding, classification and scoring views)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union


@dataclass
class Logprob:
    """A token's log probability, its rank in the distribution (1 is the best) and its text."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[Optional[dict[int, Logprob]]]


@dataclass
class RequestMetrics:
    """Timestamps (time.time()) and durations of one request's life.

    Durations are in seconds, except `model_forward_time`, in milliseconds as vLLM reports it;
    `scheduler_time`, `model_forward_time` and `model_execute_time` add up over the steps the request ran in.
    """

    arrival_time: float
    last_token_time: float
    first_scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    time_in_queue: Optional[float] = None
    finished_time: Optional[float] = None
    scheduler_time: Optional[float] = None
    model_forward_time: Optional[float] = None
    model_execute_time: Optional[float] = None
    # Speculative decoding: entry 0 counts the steps that verified proposals, entry i those that accepted at
    # least i proposed tokens; None without speculative decoding.
    spec_token_acceptance_counts: Optional[list[int]] = None


@dataclass
class CompletionOutput:
    """One completion of a request. A request that failed on its own while its batch ran (its logits processor
    raised, its logits were NaN, ...) ends with finish_reason "error" and the reason as `stop_reason`."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[SampleLogprobs]
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    lora_request: Any = None

    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestOutput:
    """The output of one request at one step; accepts and ignores unknown keyword arguments like vLLM."""

    def __init__(
        self,
        request_id: str,
        prompt: Optional[str],
        prompt_token_ids: Optional[list[int]],
        prompt_logprobs: Optional[PromptLogprobs],
        outputs: list[CompletionOutput],
        finished: bool,
        metrics: Optional[RequestMetrics] = None,
        lora_request: Any = None,
        encoder_prompt: Optional[str] = None,
        encoder_prompt_token_ids: Optional[list[int]] = None,
        num_cached_tokens: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.prompt_logprobs = prompt_logprobs
        self.outputs = outputs
        self.finished = finished
        self.metrics = metrics
        self.lora_request = lora_request
        self.encoder_prompt = encoder_prompt
        self.encoder_prompt_token_ids = encoder_prompt_token_ids
        self.num_cached_tokens = num_cached_tokens

    def __repr__(self) -> str:
        return (f"RequestOutput(request_id={self.request_id!r}, prompt={self.prompt!r}, "
                f"prompt_token_ids={self.prompt_token_ids}, outputs={self.outputs}, finished={self.finished}, "
                f"num_cached_tokens={self.num_cached_tokens})")


@dataclass
class PoolingOutput:
    """A pooling request's result: `data`, a float32 torch tensor (an embedding [hidden], class
    probabilities [classes], or one row per pooled token for ALL and STEP pooling)."""

    data: Any


class PoolingRequestOutput:
    """The one (final) output of a pooling request; `outputs` is a PoolingOutput or one of its typed views."""

    def __init__(self, request_id: str, outputs: Any, prompt_token_ids: list[int], finished: bool,
                 metrics: Optional[RequestMetrics] = None, **kwargs: Any) -> None:
        self.request_id = request_id
        self.outputs = outputs
        self.prompt_token_ids = prompt_token_ids
        self.finished = finished
        self.metrics = metrics

    @classmethod
    def from_base(cls, output: "PoolingRequestOutput") -> "PoolingRequestOutput":
        """The same output with its data in this class's typed view (e.g. `.outputs.embedding`)."""
        view = _VIEWS[cls].from_base(output.outputs) if cls in _VIEWS else output.outputs
        return cls(output.request_id, view, output.prompt_token_ids, output.finished, output.metrics)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(request_id={self.request_id!r}, outputs={self.outputs!r}, "
                f"prompt_token_ids={self.prompt_token_ids}, finished={self.finished})")


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @classmethod
    def from_base(cls, output: PoolingOutput) -> "EmbeddingOutput":
        if output.data.ndim != 1:
            raise ValueError("pooled_data should be a 1-D embedding vector")
        return cls(output.data.tolist())

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class ClassificationOutput:
    probs: list[float]

    @classmethod
    def from_base(cls, output: PoolingOutput) -> "ClassificationOutput":
        if output.data.ndim != 1:
            raise ValueError("pooled_data should be a 1-D probability vector")
        return cls(output.data.tolist())

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ScoringOutput:
    score: float

    @classmethod
    def from_base(cls, output: PoolingOutput) -> "ScoringOutput":
        if output.data.ndim != 0 and output.data.numel() != 1:
            raise ValueError("pooled_data should be a scalar score")
        return cls(float(output.data.reshape(-1)[0]))


class EmbeddingRequestOutput(PoolingRequestOutput):
    """`outputs.embedding`: the request's embedding as a list of floats."""


class ClassificationRequestOutput(PoolingRequestOutput):
    """`outputs.probs`: the request's class probabilities."""


class ScoringRequestOutput(PoolingRequestOutput):
    """`outputs.score`: the pair's score (cosine similarity of embeddings, or a cross-encoder's output)."""


_VIEWS: dict[type, Any] = {EmbeddingRequestOutput: EmbeddingOutput, ClassificationRequestOutput: ClassificationOutput,
                           ScoringRequestOutput: ScoringOutput}
