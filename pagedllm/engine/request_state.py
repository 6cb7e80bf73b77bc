"""The engine's one record of a request: everything it keeps beside the scheduler's view of it."""
from __future__ import annotations

from typing import Any, Optional

from pagedllm.core.request import Request
from pagedllm.engine.detokenizer import IncrementalDetokenizer
from pagedllm.engine.parallel_sampling import ParentRequest
from pagedllm.outputs import Logprob, RequestMetrics
from pagedllm.sampling_params import SamplingParams


class RequestState:
    """A request's text so far, logprobs, timings, guided decoding matcher and, for a sample of an n > 1
    request, its parent. Created by `add_request`, dropped in one place when the request finishes."""

    def __init__(self, request: Request, prompt: Optional[str], tokenizer: Any,
                 parent: Optional[tuple[ParentRequest, int]] = None, grammar: Any = None,
                 virtual_engine: int = 0) -> None:
        params = request.sampling_params  # PoolingParams for a pooling request: no text, no logprobs
        pooling = not isinstance(params, SamplingParams)
        self.request = request
        self.prompt = prompt
        self.parent = parent  # (the n > 1 request this one is a sample of, its index)
        self.grammar = grammar  # xgrammar matcher of a guided request
        self.virtual_engine = virtual_engine  # whose scheduler (and KV cache) it runs in
        self.detokenizer = (IncrementalDetokenizer(tokenizer, request.prompt_token_ids, params.skip_special_tokens,
                                                   params.spaces_between_special_tokens)
                            if tokenizer is not None and not pooling and params.detokenize else None)
        self.text = ""
        logprobs = None if pooling else params.logprobs
        self.logprobs: Optional[list[dict[int, Logprob]]] = [] if logprobs is not None else None
        self.cumulative_logprob: Optional[float] = 0.0 if logprobs is not None else None
        self.prompt_logprobs: Optional[list] = ([None] if not pooling and params.prompt_logprobs is not None
                                                else None)
        self.metrics = RequestMetrics(arrival_time=request.arrival_time, last_token_time=request.arrival_time)
        self.sent_tokens = 0  # for DELTA outputs
        self.sent_text = 0
        self.sent_prompt_logprobs = 0

    @property
    def request_id(self) -> str:
        return self.request.request_id
