"""The parts of vLLM's LLMEngine surface that are accessors and switches rather than the request path:
config getters, the tokenizer group, cache resets and output type validation, as `LLMEngine`'s mixin."""
from __future__ import annotations

import enum
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Optional, Sequence, TypeVar, Union

from pagedllm.config import EngineConfig

logger = logging.getLogger(__name__)
_O = TypeVar("_O")


class UsageContext(enum.Enum):
    """Who built the engine, as in vLLM; pagedllm reports usage nowhere and only keeps it on the engine."""

    UNKNOWN_CONTEXT = "UNKNOWN_CONTEXT"
    LLM_CLASS = "LLM_CLASS"
    API_SERVER = "API_SERVER"
    OPENAI_API_SERVER = "OPENAI_API_SERVER"
    OPENAI_BATCH_RUNNER = "OPENAI_BATCH_RUNNER"
    ENGINE_CONTEXT = "ENGINE_CONTEXT"


class Device(enum.Enum):
    GPU = enum.auto()
    CPU = enum.auto()


@dataclass(frozen=True)
class DecodingConfig:
    """Guided decoding as the engine runs it: xgrammar, with no other backend to fall back to."""

    backend: str = "xgrammar"
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    reasoning_backend: str = ""


class TokenizerGroup:
    """vLLM's holder of the engine's tokenizer: reading `tokenizer` gives it, setting it swaps the tokenizer the
    engine encodes prompts and decodes outputs with (from the next request on)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    @property
    def tokenizer(self) -> Any:
        return self._engine.tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: Any) -> None:
        self._engine.tokenizer = tokenizer
        self._engine.output_processor.set_tokenizer(tokenizer)

    def get_lora_tokenizer(self, lora_request: Any = None) -> Any:
        """LoRA adapters bring no tokenizer of their own here: every request uses the model's."""
        return self.tokenizer

    def encode(self, prompt: str, lora_request: Any = None, add_special_tokens: Optional[bool] = None) -> list[int]:
        kwargs = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        return self.tokenizer.encode(prompt, **kwargs)


class EngineCompatMixin:
    """Needs `config`, `tokenizer`, `output_processor` and `scheduler` on the engine."""

    DO_VALIDATE_OUTPUT: ClassVar[bool] = False

    @classmethod
    def from_vllm_config(cls, vllm_config: EngineConfig, usage_context: UsageContext = UsageContext.ENGINE_CONTEXT,
                         stat_loggers: Optional[dict[str, Any]] = None, disable_log_stats: bool = False) -> Any:
        """Build the engine from a config made by `EngineArgs.create_engine_config()`."""
        from pagedllm.executor import executor_class

        return cls(vllm_config, executor_class(vllm_config), log_stats=not disable_log_stats,
                   usage_context=usage_context, stat_loggers=stat_loggers)

    def get_vllm_config(self) -> EngineConfig:
        return self.config

    def get_decoding_config(self) -> DecodingConfig:
        return DecodingConfig()

    def get_lora_config(self) -> Optional[dict]:
        return self.config.lora_config

    def get_tokenizer_group(self) -> TokenizerGroup:
        if self.tokenizer is None:
            raise ValueError("Unable to get tokenizer because skip_tokenizer_init is True")
        return TokenizerGroup(self)

    def get_tokenizer(self, lora_request: Any = None) -> Any:
        return self.get_tokenizer_group().get_lora_tokenizer(lora_request)

    def reset_mm_cache(self) -> bool:
        """Text-only models keep no multimodal cache: there is nothing to reset."""
        return True

    def reset_prefix_cache(self, device: Optional[Union[Device, str]] = None) -> bool:
        """Forget every cached prefix block; False while requests still hold blocks. Swapped-out blocks (the
        CPU side of `device`) are never prefix-cached, so resetting only them always succeeds."""
        if device in (Device.CPU, "cpu"):
            return True
        if all([scheduler.kv_cache.reset_prefix_cache() for scheduler in self.schedulers]):
            return True
        logger.warning("Failed to reset the prefix cache: some blocks are still in use by requests.")
        return False

    @classmethod
    @contextmanager
    def enable_output_validation(cls) -> Iterator[None]:
        cls.DO_VALIDATE_OUTPUT = True
        try:
            yield
        finally:
            cls.DO_VALIDATE_OUTPUT = False

    @classmethod
    def validate_output(cls, output: object, output_type: type[_O]) -> _O:
        if cls.DO_VALIDATE_OUTPUT and not isinstance(output, output_type):
            raise TypeError(f"Expected output of type {output_type}, but found type {type(output)}")
        return output

    @classmethod
    def validate_outputs(cls, outputs: Sequence[object], output_type: type[_O]) -> list[_O]:
        return [cls.validate_output(output, output_type) for output in outputs]
