"""What comes back from the workers each step: plain data, no tensors."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional


class TokenLogprobs(NamedTuple):
    """Per position: candidate ids and their logprobs (the chosen or actual token first), and its rank."""

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    ranks: list[int]


@dataclass
class ModelRunnerOutput:
    # The new tokens of each request that sampled: one, or with speculative decoding the accepted proposed
    # tokens followed by the target's own token.
    sampled_token_ids: dict[str, list[int]]
    logprobs: dict[str, TokenLogprobs]  # one position per sampled token
    prompt_logprobs: dict[str, TokenLogprobs]  # the prompt positions computed this step
    model_forward_time: float = 0.0  # milliseconds in the model's forward pass, as vLLM reports it
    # Proposals to verify in the request's next step.
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # Requests that failed on their own this step (their seed, logits processor, non-finite logits): id -> why.
    # They keep only the tokens sampled before they failed (a verifying or multi-step step's, else none); the
    # engine finishes them with an error unless one of those tokens stopped them, and the batch goes on.
    failed: dict[str, str] = field(default_factory=dict)
    # Pooling models: request id -> its pooled output as (nested) lists of floats; None from generating models.
    pooler_outputs: Optional[dict[str, Any]] = None

