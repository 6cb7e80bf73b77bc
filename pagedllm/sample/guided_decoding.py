"""Guided decoding on xgrammar: compile a request's constraint once, then mask its tokens step by step.

The engine owns one `GrammarManager`: its compiler caches compiled grammars (the same schema compiles
once per engine), least recently used first out past VLLM_XGRAMMAR_CACHE_MB (512), so that a stream of
distinct schemas cannot grow the engine's memory without bound. Each guided request's record holds its own
matcher. Each step the manager fills a packed token bitmask for the guided requests that sample (the sampler
turns it into a mask), then each matcher is advanced with the tokens that were sampled.

With speculative decoding a request verifies several positions in one step: its proposals are first cut
before the first token the grammar refuses (`num_grammar_tokens`), then each verified position gets the mask
of the matcher walked through the proposals before it, and the matcher is walked back (xgrammar's rollback):
only the tokens verification keeps advance it.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Optional

import torch

from pagedllm.sampling_params import GuidedDecodingParams

logger = logging.getLogger(__name__)


def _cache_limit_bytes() -> int:
    """VLLM_XGRAMMAR_CACHE_MB (or its PAGEDLLM_ twin) in bytes; 512 MiB by default, as in vLLM."""
    megabytes = os.environ.get("PAGEDLLM_XGRAMMAR_CACHE_MB") or os.environ.get("VLLM_XGRAMMAR_CACHE_MB") or "512"
    return int(megabytes) * 2**20


class GrammarManager:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int],
                 cache_limit_bytes: Optional[int] = None) -> None:
        self.tokenizer = tokenizer
        self.cache_limit_bytes = _cache_limit_bytes() if cache_limit_bytes is None else cache_limit_bytes
        self.vocab_size = vocab_size
        self.stop_token_ids = stop_token_ids
        self._compiler: Any = None  # built on the first guided request: it reads the whole vocabulary

    def matcher(self, params: GuidedDecodingParams) -> Any:
        """A new matcher of the constraint (compiled once; a ValueError if it is invalid)."""
        import xgrammar as xgr

        return xgr.GrammarMatcher(self.compile(params))

    def compile(self, params: GuidedDecodingParams) -> Any:
        if self.tokenizer is None:
            raise ValueError("Guided decoding needs the tokenizer, but skip_tokenizer_init=True.")
        compiler = self._get_compiler()
        kind = params.kind
        try:
            if kind == "json":
                schema = params.json if isinstance(params.json, str) else json.dumps(params.json)
                return compiler.compile_json_schema(schema, any_whitespace=not params.disable_any_whitespace)
            if kind == "json_object":
                return compiler.compile_builtin_json_grammar()
            if kind == "regex":
                return compiler.compile_regex(params.regex)
            if kind == "choice":
                return compiler.compile_grammar(choice_grammar(params.choice))
            return compiler.compile_grammar(params.grammar)
        except Exception as error:  # xgrammar reports bad input as RuntimeError
            raise ValueError(f"Invalid guided decoding {kind}: {error}") from None

    def _get_compiler(self) -> Any:
        if self._compiler is None:
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                      stop_token_ids=self.stop_token_ids)
            self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_limit_bytes=self.cache_limit_bytes)
        return self._compiler

    def bitmasks(self, matchers: dict[str, Any], proposals: Optional[dict[str, list[int]]] = None
                 ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """Packed int32 masks [1 + its proposals, vocab/32] of the allowed tokens, by request id, for the given
        matchers (request id -> matcher) that are not terminated; and the requests whose matcher failed
        (id -> why), which fail alone. Row j is the mask after the first j proposed tokens (speculative
        decoding verifies each position under its own mask); the matchers are left where they were."""
        live = {rid: m for rid, m in matchers.items() if not m.is_terminated()}
        if not live:
            return {}, {}
        import xgrammar as xgr

        proposals = proposals or {}
        sizes = [1 + len(proposals.get(rid, ())) for rid in live]
        masks = xgr.allocate_token_bitmask(sum(sizes), self.vocab_size)  # every token allowed until filled
        result, failed, start = {}, {}, 0
        for (request_id, matcher), size in zip(live.items(), sizes):
            try:
                matcher.fill_next_token_bitmask(masks, start)
                num_grammar_tokens(matcher, proposals.get(request_id, []), masks, start)
                result[request_id] = masks[start:start + size]
            except Exception as error:
                failed[request_id] = f"its guided decoding grammar failed: {type(error).__name__}: {error}"
            start += size
        return result, failed


def num_grammar_tokens(matcher: Any, tokens: list[int], masks: Optional[torch.Tensor] = None, start: int = 0
                       ) -> int:
    """How many leading `tokens` the grammar accepts from the matcher's state, which is left unchanged (the
    walk is rolled back). With `masks`, row start + j is filled with the mask after the first j tokens; rows
    past a refused token, or past one that ends the grammar, are left as they are: verification never keeps
    a token there (the refused one is masked out at its own row; plain decoding masks nothing after the end)."""
    num_accepted = 0
    for token in tokens:
        if matcher.is_terminated() or not matcher.accept_token(token):
            break
        num_accepted += 1
        if masks is not None and not matcher.is_terminated():
            matcher.fill_next_token_bitmask(masks, start + num_accepted)
    matcher.rollback(num_accepted)
    return num_accepted


def accept_token(request_id: str, matcher: Any, token_id: int) -> None:
    """Advance a guided request's matcher by its sampled token (an exception fails the request)."""
    if not matcher.is_terminated() and not matcher.accept_token(token_id):
        logger.warning("Request %s: token %d does not fit its guided decoding grammar.", request_id, token_id)


def choice_grammar(choices: list[str]) -> str:
    """An EBNF grammar whose only sentences are the choices (JSON string literals are valid EBNF strings)."""
    return "root ::= " + " | ".join(json.dumps(choice, ensure_ascii=False) for choice in choices)
