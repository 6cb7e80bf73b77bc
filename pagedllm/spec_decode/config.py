"""`speculative_config` as vLLM takes it, validated once at start into a frozen `SpeculativeConfig`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

METHODS = ("ngram", "draft_model")
_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "quantization",
         "disable_by_batch_size"}


@dataclass(frozen=True)
class SpeculativeConfig:
    """How tokens are proposed (`method`), how many per step, and when speculation is off.

    A `draft_model` with no `model` (or the target's own) and `quantization="int8"` is the self-draft: the
    target's weights quantized to int8 propose, the float weights verify."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = 0  # ngram: longest and shortest suffix looked up in the context
    prompt_lookup_min: int = 0
    model: Optional[str] = None  # draft_model: the draft's path (None: the target's own weights)
    quantization: Optional[str] = None  # draft_model: "int8" quantizes the draft's linear layers
    disable_by_batch_size: Optional[int] = None  # no speculation while this many requests run

    @property
    def num_lookahead_slots(self) -> int:
        """KV slots past the verified tokens that a draft model writes while proposing."""
        return self.num_speculative_tokens if self.method == "draft_model" else 0

    @property
    def uses_draft_model(self) -> bool:
        return self.method == "draft_model"


def parse_speculative_config(raw: Any) -> Optional[SpeculativeConfig]:
    """vLLM's dict (or None) -> SpeculativeConfig; a bad value raises ValueError naming its field."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"speculative_config must be a dict (JSON object), got {type(raw).__name__}.")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ValueError(f"speculative_config has unsupported field(s) {unknown}; supported: {sorted(_KEYS)}.")
    method = raw.get("method") or ("ngram" if raw.get("model") in ("ngram", "[ngram]") else "draft_model")
    if method == "draft" or method == "draft_model":
        method = "draft_model"
    if method not in METHODS:
        raise ValueError(f"speculative_config method {method!r} is not supported; use one of {METHODS}.")
    k = raw.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 16:
        raise ValueError(f"speculative_config num_speculative_tokens must be an integer from 1 to 16, got {k!r}.")
    disable = raw.get("disable_by_batch_size")
    if disable is not None and (not isinstance(disable, int) or disable < 2):
        raise ValueError(f"speculative_config disable_by_batch_size must be an integer of at least 2, got "
                         f"{disable!r}.")
    if method == "ngram":
        return _ngram(raw, k, disable)
    return _draft_model(raw, k, disable)


def _ngram(raw: dict, k: int, disable: Optional[int]) -> SpeculativeConfig:
    for name in ("quantization",):
        if raw.get(name) is not None:
            raise ValueError(f"speculative_config {name} applies to method 'draft_model', not 'ngram'.")
    high, low = raw.get("prompt_lookup_max", 4), raw.get("prompt_lookup_min", 1)
    for name, value in (("prompt_lookup_max", high), ("prompt_lookup_min", low)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"speculative_config {name} must be a positive integer, got {value!r}.")
    if low > high:
        raise ValueError(f"speculative_config prompt_lookup_min ({low}) must not exceed prompt_lookup_max "
                         f"({high}).")
    return SpeculativeConfig("ngram", k, high, low, disable_by_batch_size=disable)


def _draft_model(raw: dict, k: int, disable: Optional[int]) -> SpeculativeConfig:
    for name in ("prompt_lookup_max", "prompt_lookup_min"):
        if raw.get(name) is not None:
            raise ValueError(f"speculative_config {name} applies to method 'ngram', not 'draft_model'.")
    quantization = raw.get("quantization")
    if quantization not in (None, "int8"):
        raise ValueError(f"speculative_config quantization {quantization!r} is not supported; use None or 'int8'.")
    model = raw.get("model")
    if model is None and quantization is None:
        raise ValueError("speculative_config model is required for method 'draft_model' (or give "
                         "quantization='int8' to draft with the target's own weights in int8).")
    return SpeculativeConfig("draft_model", k, model=model, quantization=quantization, disable_by_batch_size=disable)


def check_draft_vocabulary(config: SpeculativeConfig, target_hf_config: Any) -> None:
    """A draft model must share the target's vocabulary: its tokens are the target's tokens."""
    if config.model is None:
        return
    from pagedllm.model.source import resolve_model_source

    try:
        draft = resolve_model_source(config.model)
    except (OSError, ValueError) as error:
        raise ValueError(f"speculative_config model {config.model!r} cannot be loaded: {error}") from error
    if draft.hf_config.vocab_size != target_hf_config.vocab_size:
        raise ValueError(f"speculative_config model {config.model!r} has a vocabulary of {draft.hf_config.vocab_size} "
                         f"tokens, the target {target_hf_config.vocab_size}: the draft must use the same tokenizer.")
