"""The sampler: a pipeline of named steps over a batch of logits, each row with its own parameters.

Order: user logits processors -> logit_bias -> allowed_token_ids -> banned tokens (min_tokens, bad words)
-> guided-decoding mask -> presence, frequency and repetition penalties -> log-probabilities of the
resulting distribution (what `logprobs` reports) -> greedy rows take the argmax -> random rows are scaled
by temperature, filtered by top-k, top-p and min-p, and sampled by an exponential race (seeded rows draw
from their own generator, so their tokens do not depend on the rest of the batch).
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional

import torch

from pagedllm.model.cpu_kernels import load_row_max, serves
from pagedllm.sample.metadata import SamplingMetadata

LogitsStep = Callable[[torch.Tensor, SamplingMetadata], torch.Tensor]


# The token of a row that could not be sampled: its logits' largest value is NaN or infinite.
UNSAMPLEABLE = -1


NO_TOKEN_LEFT = "every token was masked out, so none can be sampled"  # a row whose logits are all -inf


class SamplerOutput(NamedTuple):
    token_ids: torch.Tensor  # [N] long
    # When any row asked for logprobs: [N, 1 + k] ids and logprobs (the sampled token first), [N] ranks.
    logprob_token_ids: Optional[torch.Tensor]
    logprobs: Optional[torch.Tensor]
    sampled_ranks: Optional[torch.Tensor]
    maxima: torch.Tensor  # [N] each row's largest logit: a row whose largest is not finite cannot be sampled
    failed: dict[int, str]  # rows failed before sampling (a logits processor raised), with why

    def to_host(self) -> tuple[list[int], dict[int, str]]:
        """The sampled tokens as a list, UNSAMPLEABLE in every row that failed, and those rows with why. The
        maxima are checked on the host: on a GPU their copy is queued before the tokens' transfer, whose wait
        covers both, so a step waits for the device once; on the CPU a step whose kernels find the argmax
        (cpu_graph's greedy step) then runs no PyTorch operator for the check."""
        maxima = self.maxima if self.maxima.device.type == "cpu" else self.maxima.to("cpu", non_blocking=True)
        tokens = self.token_ids.tolist()
        failed = unsampleable_rows(maxima.tolist(), self.failed)
        for row in failed:
            tokens[row] = UNSAMPLEABLE
        return tokens, failed


def unsampleable_rows(maxima: list[float], failed: dict[int, str]) -> dict[int, str]:
    """The rows that cannot be sampled, with why: those that failed before sampling, and those whose largest
    logit (maxima, one per row) is not finite."""
    failed = dict(failed)
    for row, maximum in enumerate(maxima):
        if not math.isfinite(maximum) and row not in failed:
            failed[row] = NO_TOKEN_LEFT if maximum == -math.inf else "its logits contain NaN or infinity"
    return failed


class Sampler:
    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        """logits [N, vocab] -> one token per row."""
        logits = process_logits(logits, meta)
        logprobs = torch.log_softmax(logits, dim=-1) if meta.max_num_logprobs is not None else None
        maxima, greedy_tokens = row_max(logits)
        if meta.all_greedy:
            tokens = greedy_tokens
        else:
            tokens = torch.where(meta.greedy, greedy_tokens, sample_random(logits, meta))
        gathered = (None, None, None) if logprobs is None else gather_logprobs(logprobs, tokens, meta.max_num_logprobs)
        return SamplerOutput(tokens, *gathered, maxima, meta.failed)


def row_max(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's largest logit and the index of its first occurrence (the greedy token; NaN where the row has
    one): the C kernel for float32 rows on CPU, else max(dim).indices, argmax at a third of its cost on CPU."""
    if serves(logits) and logits.dim() == 2 and logits.stride(1) == 1:
        kernel = load_row_max()
        if kernel is not None:
            return kernel(logits)
    values, indices = logits.max(dim=-1)
    return values, indices


def process_logits(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """The named steps before sampling: the distribution that `logprobs` reports and greedy rows take the
    argmax of."""
    logits = logits.float()
    for step in LOGITS_STEPS:
        logits = step(logits, meta)
    return logits


def apply_logits_processors(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """Each row's processors in turn; one that raises fails its row, the rest of the batch goes on."""
    for entry in meta.logits_processors:
        if entry.row in meta.failed:
            continue
        args = (entry.output_ids,) if entry.prompt_ids is None else (entry.prompt_ids, entry.output_ids)
        try:
            logits[entry.row] = entry.processor(*args, logits[entry.row])
        except Exception as error:
            meta.failed[entry.row] = f"its logits processor raised {type(error).__name__}: {error}"
    return logits


def apply_logit_bias(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    if meta.logit_bias is not None:
        rows, tokens, biases = meta.logit_bias
        logits.index_put_((rows, tokens), biases, accumulate=True)
    return logits


def apply_allowed_token_ids(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    if meta.allowed is not None:
        rows, mask = meta.allowed
        logits[rows] = logits[rows].masked_fill(~mask, float("-inf"))
    return logits


def apply_banned_tokens(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    if meta.banned is not None:
        logits[meta.banned] = float("-inf")
    return logits


def apply_grammar_mask(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """Bit j of a row's packed bitmask says whether token j keeps the output inside the grammar."""
    if meta.grammar is not None:
        rows, packed = meta.grammar
        bits = torch.arange(32, device=packed.device, dtype=torch.int32)
        allowed = ((packed.unsqueeze(-1) >> bits) & 1).bool().flatten(1)[:, :logits.shape[1]]
        logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
    return logits


def apply_penalties(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """Presence and frequency penalties count output tokens; the repetition penalty divides positive (and
    multiplies negative) logits of every token seen in the prompt or the output."""
    penalties = meta.penalties
    if penalties is None:
        return logits
    num_rows, vocab = logits.shape
    output_counts = _token_counts(penalties.output_ids, num_rows, vocab)
    seen = (_token_counts(penalties.prompt_ids, num_rows, vocab) > 0) | (output_counts > 0)
    repetition = penalties.repetition.unsqueeze(1).expand_as(logits)
    scaled = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = torch.where(seen, scaled, logits)
    logits -= penalties.frequency.unsqueeze(1) * output_counts
    logits -= penalties.presence.unsqueeze(1) * (output_counts > 0)
    return logits


def _token_counts(ids: torch.Tensor, num_rows: int, vocab: int) -> torch.Tensor:
    """[N, L] ids padded with `vocab` -> [N, vocab] occurrence counts."""
    counts = torch.zeros(num_rows, vocab + 1, dtype=torch.float32, device=ids.device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
    return counts[:, :vocab]


LOGITS_STEPS: tuple[LogitsStep, ...] = (apply_logits_processors, apply_logit_bias, apply_allowed_token_ids,
                                        apply_banned_tokens, apply_grammar_mask, apply_penalties)


def sample_random(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    return exponential_race(random_probs(logits, meta), meta.generators)


def random_probs(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """The distribution random rows sample from, after temperature, top-k, top-p and min-p (not renormalized
    after min-p)."""
    logits = logits / meta.temperature.unsqueeze(1)
    logits = apply_top_k_top_p(logits, meta.top_k, meta.top_p)
    probs = torch.softmax(logits, dim=-1)
    if meta.min_p is not None:
        threshold = probs.amax(dim=-1, keepdim=True) * meta.min_p.unsqueeze(1)
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs


def apply_top_k_top_p(logits: torch.Tensor, top_k: Optional[torch.Tensor],
                      top_p: Optional[torch.Tensor]) -> torch.Tensor:
    if top_k is None and top_p is None:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    vocab = logits.shape[-1]
    if top_k is not None:
        # Keep the k largest: everything below the k-th largest value goes.
        kth = sorted_logits.gather(1, (vocab - top_k.clamp(1, vocab)).unsqueeze(1))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    if top_p is not None:
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - top_p).unsqueeze(1)
        drop[:, -1] = False  # the most likely token always stays
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def exponential_race(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """argmax(p / E) with E ~ Exp(1) samples from p, with no device sync."""
    race = torch.empty_like(probs).exponential_()
    for row, generator in generators.items():
        race[row].exponential_(generator=generator)
    return probs.div(race).argmax(dim=-1)


def gather_logprobs(logprobs: torch.Tensor, tokens: torch.Tensor,
                    k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sampled token's logprob and rank, followed by the top-k (ids and values)."""
    sampled = logprobs.gather(1, tokens.unsqueeze(1))
    ranks = (logprobs > sampled).sum(dim=-1) + 1
    top_values, top_ids = logprobs.topk(k, dim=-1) if k > 0 else (logprobs[:, :0], tokens[:, None][:, :0])
    return torch.cat([tokens.unsqueeze(1), top_ids], dim=1), torch.cat([sampled, top_values], dim=1), ranks
