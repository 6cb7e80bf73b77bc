"""What the server and the engine process send each other over their pipe: plain, picklable data."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from pagedllm.outputs import RequestOutput
from pagedllm.sampling_params import SamplingParams


# --- server -> engine ----------------------------------------------------------------------------------------

@dataclass
class AddRequest:
    request_id: str
    prompt: Any  # a TokensPrompt or text, as AsyncLLMEngine.generate takes it
    params: SamplingParams
    trace_headers: Optional[dict[str, str]] = None
    priority: int = 0
    lora_request: Any = None


@dataclass
class AbortRequests:
    request_ids: list[str]


@dataclass
class Query:
    """Ask the engine process for a value, or to act, between two steps: "health", "metrics", "sleep",
    "wake_up", "is_sleeping" or a LoRA call ("add_lora", "remove_lora", "list_loras"), with the call's
    arguments."""

    query_id: int
    what: str
    args: tuple = ()


@dataclass
class Shutdown:
    pass


# --- engine -> server ----------------------------------------------------------------------------------------

@dataclass
class Ready:
    """Sent once the engine is built: what the server needs to parse, validate and tokenize requests."""

    model_config: Any
    scheduler_config: Any
    tokenizer: Any
    default_params: SamplingParams


@dataclass
class StartupFailed:
    message: str


@dataclass
class Outputs:
    outputs: list[RequestOutput]


@dataclass
class Rejected:
    """The engine refused a request (add_request raised); `kind` is the exception's class name."""

    request_id: str
    kind: str
    message: str


@dataclass
class Answer:
    query_id: int
    value: Any = None
    error: Optional[str] = None
    kind: str = ""  # the class name of the exception behind `error`
