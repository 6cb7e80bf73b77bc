"""Parameters of one pooling request (embedding, classification, score, reward), validated on construction."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Optional

from pagedllm.sampling_params import RequestOutputKind

# extra_kwargs key: the index of a text pair's first token of type 1 (every token from it on is of type 1, those
# before it of type 0), how a BERT cross-encoder's token_type_ids reach the model.
TOKEN_TYPE_SPLIT = "compressed_token_type_ids"

# Which parameters each pooling task reads; setting any other one is an error rather than silently ignored.
_TASK_PARAMS: dict[str, tuple[str, ...]] = {
    "embed": ("dimensions", "normalize"),
    "classify": ("activation",),
    "score": ("activation",),
    "encode": ("softmax",),
}


@dataclass
class PoolingParams:
    """`dimensions`: keep the first this many components of an embedding (then normalize, if normalizing);
    `normalize`: L2-normalize embeddings (None: the model's default); `activation`: apply the classification
    head's activation (softmax over classes, sigmoid for one) to classify and score outputs (None: on);
    `softmax`: softmax over the last axis of `encode` outputs (None: the model's default);
    `task`: set by the API that takes the request (`LLM.embed` sets "embed", and so on); `extra_kwargs`: what
    the API derives for the model (a text pair's token types, see TOKEN_TYPE_SPLIT)."""

    dimensions: Optional[int] = None
    normalize: Optional[bool] = None
    activation: Optional[bool] = None
    softmax: Optional[bool] = None
    use_cross_encoder: bool = False
    additional_data: Optional[Any] = None
    truncate_prompt_tokens: Optional[int] = None
    task: Optional[str] = None
    extra_kwargs: Optional[dict[str, Any]] = None
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY

    def __post_init__(self) -> None:
        if self.dimensions is not None and (not isinstance(self.dimensions, int) or self.dimensions < 1):
            raise ValueError(f"dimensions must be a positive integer, got {self.dimensions!r}.")
        for name in ("normalize", "activation", "softmax"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{name} must be True, False or None, got {value!r}.")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            raise ValueError(f"truncate_prompt_tokens must be >= 1, got {self.truncate_prompt_tokens}.")
        if self.extra_kwargs is not None and not isinstance(self.extra_kwargs, dict):
            raise ValueError(f"extra_kwargs must be a dict or None, got {self.extra_kwargs!r}.")
        if self.task is not None and self.task not in _TASK_PARAMS:
            raise ValueError(f"Unknown pooling task {self.task!r}; pooling tasks are: {', '.join(_TASK_PARAMS)}.")
        if self.output_kind != RequestOutputKind.FINAL_ONLY:
            raise ValueError("output_kind: pooling requests return one final output (RequestOutputKind.FINAL_ONLY).")

    def verify(self, task: str, hidden_size: Optional[int] = None) -> None:
        """Check the parameters against the request's task (and an embedding's size)."""
        allowed = _TASK_PARAMS[task]
        for name in ("dimensions", "normalize", "activation", "softmax"):
            if getattr(self, name) is not None and name not in allowed:
                raise ValueError(f"Task {task} only supports {list(allowed)} parameters, does not support "
                                 f"{name}={getattr(self, name)!r}.")
        if self.dimensions is not None and hidden_size is not None and self.dimensions > hidden_size:
            raise ValueError(f"dimensions ({self.dimensions}) must be at most the model's embedding size "
                             f"({hidden_size}).")

    def with_task(self, task: str) -> "PoolingParams":
        params = copy.copy(self)
        params.task = task
        return params

    def clone(self) -> "PoolingParams":
        return copy.deepcopy(self)
