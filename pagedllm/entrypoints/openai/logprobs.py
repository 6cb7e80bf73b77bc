"""Engine logprobs (one {token_id: Logprob} dict per token) in the completions and chat API shapes."""
from __future__ import annotations

import math
from typing import Any, Optional

from pagedllm.entrypoints.openai.protocol import CompletionLogProbs, TokenLogprob, TopLogprob
from pagedllm.outputs import Logprob

# JSON has no infinity; like OpenAI, report impossible tokens with a very low finite value.
_FLOOR = -9999.0


def _value(logprob: float) -> float:
    return _FLOOR if math.isinf(logprob) or logprob < _FLOOR else logprob


class TokenNamer:
    """How a token id is shown: its text, or `token_id:N` when the request asks for ids."""

    def __init__(self, tokenizer: Any, as_ids: bool) -> None:
        self.tokenizer = tokenizer
        self.as_ids = as_ids

    def __call__(self, token_id: int, logprob: Optional[Logprob] = None) -> str:
        if self.as_ids:
            return f"token_id:{token_id}"
        if logprob is not None and logprob.decoded_token is not None:
            return logprob.decoded_token
        return self.tokenizer.decode([token_id])


def completion_logprobs(token_ids: list[int], logprobs: list[Optional[dict[int, Logprob]]], name: TokenNamer,
                        text_offset: int) -> CompletionLogProbs:
    """Completions' logprobs for `token_ids`, whose text starts at `text_offset` of the choice's text."""
    result = CompletionLogProbs()
    for token_id, step in zip(token_ids, logprobs):
        chosen = step.get(token_id) if step else None
        token = name(token_id, chosen)
        result.tokens.append(token)
        result.text_offset.append(text_offset)
        text_offset += len(token)
        result.token_logprobs.append(_value(chosen.logprob) if chosen else None)
        result.top_logprobs.append({name(t, lp): _value(lp.logprob) for t, lp in step.items()} if step else None)
    return result


def chat_logprobs(token_ids: list[int], logprobs: list[dict[int, Logprob]], top: int,
                  name: TokenNamer) -> list[TokenLogprob]:
    """Chat's logprobs: each sampled token with the `top` most likely alternatives."""
    content = []
    for token_id, step in zip(token_ids, logprobs):
        token = name(token_id, step.get(token_id))
        alternatives = [TopLogprob(token=name(t, lp), logprob=_value(lp.logprob),
                                   bytes=list(name(t, lp).encode("utf-8")))
                        for t, lp in list(step.items())[:top]]
        content.append(TokenLogprob(token=token, logprob=_value(step[token_id].logprob),
                                    bytes=list(token.encode("utf-8")), top_logprobs=alternatives))
    return content
