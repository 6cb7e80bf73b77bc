"""Sampling parameters of one request, validated on construction."""
from __future__ import annotations

import copy
import dataclasses
import enum
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

logger = logging.getLogger(__name__)

_SAMPLING_EPS = 1e-5
# Temperatures below this are numerically unstable and treated as this value.
_MIN_TEMPERATURE = 1e-2
# A repetition penalty divides or multiplies float32 logits: past these bounds the penalized logits (of a few
# hundred at most, then divided by a temperature of at least _MIN_TEMPERATURE) overflow to infinity or NaN.
_REPETITION_PENALTY_RANGE = (1e-20, 1e20)

LogitsProcessor = Union[
    Callable[[list[int], Any], Any],
    Callable[[list[int], list[int], Any], Any],
]


class RequestOutputKind(enum.Enum):
    """How much of a request's output each `RequestOutput` carries."""

    CUMULATIVE = 0  # everything generated so far
    DELTA = 1  # only what is new since the last output
    FINAL_ONLY = 2  # one output, when the request finishes


@dataclass
class GuidedDecodingParams:
    """Constrain the output to a JSON schema, a regex, one of some choices, an EBNF grammar or any JSON object.

    Exactly one of `json`, `regex`, `choice`, `grammar`, `json_object` is set. `backend` may be None, "auto"
    or "xgrammar" (the only backend), optionally with options after a colon ("xgrammar:disable-any-whitespace").
    """

    json: Optional[Union[str, dict]] = None
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    backend: Optional[str] = None
    backend_was_auto: bool = False
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: Optional[str] = None
    structural_tag: Optional[str] = None

    def __post_init__(self) -> None:
        kinds = [name for name in _GUIDE_KINDS if getattr(self, name) not in (None, False)]
        if len(kinds) > 1:
            raise ValueError(f"You can only use one kind of guided decoding but multiple are specified: {kinds}.")
        if not kinds:
            raise ValueError(f"guided_decoding must specify one of {', '.join(_GUIDE_KINDS)}.")
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) for c in self.choice)):
            raise ValueError("guided_decoding choice must be a non-empty list of strings.")
        name, _, options = (self.backend or "auto").partition(":")
        if name not in ("auto", "xgrammar"):
            raise ValueError(f"guided_decoding backend must be 'auto' or 'xgrammar', got {self.backend!r}.")
        if "disable-any-whitespace" in options.split(","):
            self.disable_any_whitespace = True

    @property
    def kind(self) -> str:
        return next(name for name in _GUIDE_KINDS if getattr(self, name) not in (None, False))


_GUIDE_KINDS = ("json", "regex", "choice", "grammar", "json_object")
# Fields that `SamplingParams.from_optional` sets to their default when given None.
_NONE_MEANS_DEFAULT = ("n", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p")


class SamplingType(enum.IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


@dataclass
class SamplingParams:
    """vLLM's sampling parameters with vLLM's defaults; a bad value raises ValueError naming it."""

    n: int = 1
    best_of: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    bad_words: Optional[list[str]] = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logits_processors: Optional[list[LogitsProcessor]] = None
    truncate_prompt_tokens: Optional[int] = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    guided_decoding: Optional[GuidedDecodingParams] = None
    logit_bias: Optional[dict[int, float]] = None
    allowed_token_ids: Optional[list[int]] = None
    extra_args: Optional[dict[str, Any]] = None
    # Filled by the engine from the model's generation config: EOS ids beyond the tokenizer's.
    all_stop_token_ids: set[int] = field(default_factory=set, repr=False)
    # Filled by the engine from the tokenizer: each bad word as token ids, with and without a leading space.
    bad_words_token_ids: list[list[int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.seed == -1:  # vLLM's spelling of "no seed"
            self.seed = None
        if isinstance(self.logprobs, bool):  # True asks for the sampled token's logprob alone, as in vLLM
            self.logprobs = int(self.logprobs)
        if isinstance(self.prompt_logprobs, bool):
            self.prompt_logprobs = int(self.prompt_logprobs)
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.bad_words = list(self.bad_words or [])
        if isinstance(self.guided_decoding, dict):
            self.guided_decoding = GuidedDecodingParams(**self.guided_decoding)
        self._verify_types()
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of must be greater than or equal to n, got n={self.n} and best_of={self.best_of}.")
        if 0 < self.temperature < _MIN_TEMPERATURE:
            logger.warning(
                "temperature %s is less than %s, which may cause numerical errors; it is set to %s.",
                self.temperature, _MIN_TEMPERATURE, _MIN_TEMPERATURE)
            self.temperature = _MIN_TEMPERATURE
        if self.logit_bias is not None:
            self._verify_logit_bias()
            self.logit_bias = {int(t): min(100.0, max(-100.0, float(b))) for t, b in self.logit_bias.items()}
        self._verify()
        if self.temperature < _SAMPLING_EPS:
            # Greedy: the filters would not change the argmax, so switch them off.
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
        self.all_stop_token_ids = set(self.stop_token_ids)

    def _verify(self) -> None:
        checks = [
            (self.n >= 1, "n", f"must be at least 1, got {self.n}."),
            (self.best_of is None or self.best_of >= 1, "best_of", f"must be at least 1, got {self.best_of}."),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty",
             f"must be in [-2, 2], got {self.presence_penalty}."),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty",
             f"must be in [-2, 2], got {self.frequency_penalty}."),
            (_REPETITION_PENALTY_RANGE[0] <= self.repetition_penalty <= _REPETITION_PENALTY_RANGE[1],
             "repetition_penalty", f"must be in [{_REPETITION_PENALTY_RANGE[0]:g}, {_REPETITION_PENALTY_RANGE[1]:g}] "
             f"(greater than zero, and not so far from 1 that penalized float32 logits overflow), got "
             f"{self.repetition_penalty}."),
            (self.temperature >= 0.0, "temperature", f"must be non-negative, got {self.temperature}."),
            (0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}."),
            (self.top_k >= -1, "top_k", f"must be -1 (disable), 0 (disable) or at least 1, got {self.top_k}."),
            (0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}."),
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens",
             f"must be at least 1, got {self.max_tokens}."),
            (self.min_tokens >= 0, "min_tokens", f"must be greater than or equal to 0, got {self.min_tokens}."),
            (self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
             f"must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}."),
            (self.logprobs is None or self.logprobs >= 0, "logprobs", f"must be non-negative, got {self.logprobs}."),
            (self.prompt_logprobs is None or self.prompt_logprobs >= 0, "prompt_logprobs",
             f"must be non-negative, got {self.prompt_logprobs}."),
            (self.truncate_prompt_tokens is None or self.truncate_prompt_tokens >= 1, "truncate_prompt_tokens",
             f"must be >= 1, got {self.truncate_prompt_tokens}."),
            (all(isinstance(s, str) and s for s in self.stop), "stop", "must contain only non-empty strings."),
            (not self.stop or self.detokenize, "stop", "strings are only supported when detokenize is True."),
            (all(isinstance(w, str) and w.strip() for w in self.bad_words), "bad_words",
             "must contain only non-empty strings."),
            (all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids), "stop_token_ids",
             "must contain only non-negative integers."),
            (self.allowed_token_ids is None or len(self.allowed_token_ids) > 0, "allowed_token_ids",
             "must not be empty."),
            (self.allowed_token_ids is None or all(isinstance(t, int) for t in self.allowed_token_ids),
             "allowed_token_ids", "must contain only integers."),
            (all(callable(p) for p in self.logits_processors or []), "logits_processors",
             "must contain only callables."),
            (self.guided_decoding is None or isinstance(self.guided_decoding, GuidedDecodingParams),
             "guided_decoding", f"must be GuidedDecodingParams, got {type(self.guided_decoding).__name__}."),
            (isinstance(self.output_kind, RequestOutputKind), "output_kind",
             f"must be a RequestOutputKind, got {self.output_kind!r}."),
        ]
        for ok, name, message in checks:
            if not ok:
                raise ValueError(f"{name} {message}")
        if self.best_of is not None and self.best_of > 1 and self.temperature < _SAMPLING_EPS:
            raise ValueError("best_of must be 1 when using greedy sampling (temperature=0), "
                             f"got best_of={self.best_of}.")
        if self.n > 1 and self.temperature < _SAMPLING_EPS:
            raise ValueError(f"n must be 1 when using greedy sampling, got {self.n}.")
        if self.best_of is not None and self.best_of != self.n and self.output_kind == RequestOutputKind.DELTA:
            raise ValueError("best_of must equal n to use output_kind=DELTA")

    @classmethod
    def from_optional(cls, *args: Any, **kwargs: Any) -> "SamplingParams":
        """vLLM's constructor for API layers, where an unset field arrives as None: None for n, the penalties,
        temperature or top_p means the default. Positional arguments follow the fields' order, as in vLLM."""
        names = [f.name for f in dataclasses.fields(cls)]
        kwargs.update(zip(names, args))
        return cls(**{name: value for name, value in kwargs.items()
                      if not (value is None and name in _NONE_MEANS_DEFAULT)})

    def update_from_generation_config(self, generation_config: dict[str, Any],
                                      model_eos_token_id: Optional[int] = None) -> None:
        """Make the generation config's EOS ids other than the model's own EOS stop tokens (unless ignore_eos),
        as the engine does for every request."""
        eos = generation_config.get("eos_token_id")
        if eos is None or self.ignore_eos:
            return
        ids = ({eos} if isinstance(eos, int) else set(eos)) - {model_eos_token_id}
        if ids:
            self.stop_token_ids = sorted(ids | set(self.stop_token_ids))
            self.all_stop_token_ids.update(ids)

    def _verify_types(self) -> None:
        """Integers must be integers (a float n or a string seed is a ValueError, as in vLLM)."""
        for name in ("n", "best_of", "top_k", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs",
                     "truncate_prompt_tokens", "seed"):
            value = getattr(self, name)
            optional = name not in ("n", "top_k", "min_tokens")
            if (value is None and optional) or (isinstance(value, int) and not isinstance(value, bool)):
                continue
            raise ValueError(f"{name} must be an int, but is of type {type(value).__name__}.")
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p",
                     "min_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number, but is of type {type(value).__name__}.")

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < _SAMPLING_EPS:
            return SamplingType.GREEDY
        return SamplingType.RANDOM_SEED if self.seed is not None else SamplingType.RANDOM

    def _verify_logit_bias(self) -> None:
        for token, bias in self.logit_bias.items():
            try:
                int(token), float(bias)
            except (TypeError, ValueError):
                raise ValueError(f"logit_bias must map token ids to numbers, got {token!r}: {bias!r}.") from None

    def update_from_tokenizer(self, tokenizer: Any) -> None:
        """Tokenize the bad words, each alone and after a space (where that is a different token sequence)."""
        sequences: list[list[int]] = []
        for word in self.bad_words:
            for text in (word.lstrip(), " " + word.lstrip()):
                ids = tokenizer.encode(text, add_special_tokens=False)
                if ids and ids not in sequences:
                    sequences.append(ids)
        self.bad_words_token_ids = sequences

    def clone(self) -> "SamplingParams":
        """A copy that shares the (possibly unpicklable) logits processors."""
        processors = self.logits_processors
        self.logits_processors = None
        try:
            params = copy.deepcopy(self)
        finally:
            self.logits_processors = processors
        params.logits_processors = processors
        return params


@dataclass
class BeamSearchParams:
    """Parameters of `LLM.beam_search`."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.beam_width, int) or self.beam_width < 1:
            raise ValueError(f"beam_width must be an integer of at least 1, got {self.beam_width!r}.")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer of at least 1, got {self.max_tokens!r}.")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
