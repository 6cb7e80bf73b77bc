"""Guided decoding on xgrammar: compile a request's constraint once, then mask its tokens step by step.

The engine owns one `GrammarManager`: its compiler caches compiled grammars (the same schema compiles
once per engine). Each guided request's record holds its own matcher. Each step the manager fills a packed
token bitmask for the guided requests that sample (the sampler turns it into a mask), then each matcher is
advanced with the token that was sampled.
"""
from __future__ import annotations

import json
import logging
from typing import Any

import torch

from pagedllm.sampling_params import GuidedDecodingParams

logger = logging.getLogger(__name__)


class GrammarManager:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        self.tokenizer = tokenizer
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
            self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        return self._compiler

    def bitmasks(self, matchers: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """Packed int32 masks [vocab/32] of the next allowed tokens, by request id, for the given matchers
        (request id -> matcher) that are not terminated; and the requests whose matcher failed (id -> why),
        which fail alone."""
        import xgrammar as xgr

        live = {rid: m for rid, m in matchers.items() if not m.is_terminated()}
        if not live:
            return {}, {}
        masks = xgr.allocate_token_bitmask(len(live), self.vocab_size)
        failed = {}
        for i, (request_id, matcher) in enumerate(live.items()):
            try:
                matcher.fill_next_token_bitmask(masks, i)
            except Exception as error:
                failed[request_id] = f"its guided decoding grammar failed: {type(error).__name__}: {error}"
        return {rid: mask for rid, mask in zip(live, masks) if rid not in failed}, failed


def accept_token(request_id: str, matcher: Any, token_id: int) -> None:
    """Advance a guided request's matcher by its sampled token (an exception fails the request)."""
    if not matcher.is_terminated() and not matcher.accept_token(token_id):
        logger.warning("Request %s: token %d does not fit its guided decoding grammar.", request_id, token_id)


def choice_grammar(choices: list[str]) -> str:
    """An EBNF grammar whose only sentences are the choices (JSON string literals are valid EBNF strings)."""
    return "root ::= " + " | ".join(json.dumps(choice, ensure_ascii=False) for choice in choices)
