"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the context's last n tokens
(n from prompt_lookup_max down to prompt_lookup_min). Answers that copy their prompt (edits, quotes, code)
find long runs this way at no model cost."""
from __future__ import annotations

from pagedllm.spec_decode.proposer import DraftContext, Proposer


def lookup(tokens: list[int], num_tokens: int, min_n: int, max_n: int) -> list[int]:
    """The up to `num_tokens` tokens after the latest earlier match of the longest suffix that has one."""
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        suffix = tokens[-n:]
        first = suffix[0]
        # A match ends before the last token, so that at least one token follows it.
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start] == first and tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + num_tokens]
    return []


class NgramProposer(Proposer):
    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n

    def propose(self, contexts: list[DraftContext], num_tokens: int) -> dict[str, list[int]]:
        proposals = {}
        for request, tokens in contexts:
            proposed = lookup(tokens, num_tokens, self.min_n, self.max_n)
            if proposed:
                proposals[request.request_id] = proposed
        return proposals
