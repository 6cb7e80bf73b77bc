"""The sampling parameters of one step's sampling rows, gathered into tensors once per step."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional, Protocol

import torch

from pagedllm.device_tensor import device_tensor
from pagedllm.sampling_params import SamplingParams, SamplingType


class SamplingRequest(Protocol):
    """What sampling reads of a request (the worker's copy of it)."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: Optional[int]

    @property
    def num_output_tokens(self) -> int: ...


class Penalties(NamedTuple):
    """Per-row penalty values and the token ids they count, padded with the id `vocab_size`."""

    presence: torch.Tensor  # [N] float
    frequency: torch.Tensor  # [N] float
    repetition: torch.Tensor  # [N] float
    prompt_ids: torch.Tensor  # [N, P] long
    output_ids: torch.Tensor  # [N, O] long


class RowProcessor(NamedTuple):
    """A user logits processor and what it is called with for one row."""

    row: int
    processor: Callable[..., torch.Tensor]
    prompt_ids: Optional[list[int]]  # None for the (output_ids, logits) signature
    output_ids: list[int]


@dataclass
class SamplingMetadata:
    """Row i describes the i-th request that samples this step; a part is None when no row uses it."""

    temperature: torch.Tensor  # [N] float, 1.0 on greedy rows
    greedy: torch.Tensor  # [N] bool
    all_greedy: bool
    top_k: Optional[torch.Tensor]  # [N] long, vocab size where off
    top_p: Optional[torch.Tensor]  # [N] float
    min_p: Optional[torch.Tensor]  # [N] float
    generators: dict[int, torch.Generator]  # row -> the request's own generator when seeded
    max_num_logprobs: Optional[int]
    logits_processors: list[RowProcessor]
    penalties: Optional[Penalties]
    logit_bias: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # rows, token ids, values
    allowed: Optional[tuple[torch.Tensor, torch.Tensor]]  # rows [R], mask [R, vocab] (True: may be sampled)
    # Tokens that may not be sampled: min_tokens not reached (stop ids) and bad words; (rows, token ids).
    banned: Optional[tuple[torch.Tensor, torch.Tensor]]
    grammar: Optional[tuple[torch.Tensor, torch.Tensor]]  # rows [R], packed int32 bitmasks [R, vocab/32]
    # Rows that failed on their own (a logits processor raised): row -> why, filled by the sampler's steps.
    failed: dict[int, str] = field(default_factory=dict)

    @classmethod
    def build(cls, requests: list[SamplingRequest], generators: dict[str, torch.Generator], vocab_size: int,
              device: torch.device, grammar_bitmasks: Optional[dict[str, torch.Tensor]] = None
              ) -> "SamplingMetadata":
        params = [r.sampling_params for r in requests]
        greedy = [p.sampling_type == SamplingType.GREEDY for p in params]
        top_k = [p.top_k if p.top_k > 0 else vocab_size for p in params]
        logprobs = [p.logprobs for p in params if p.logprobs is not None]

        def tensor(values: list, dtype: torch.dtype, unused: object) -> Optional[torch.Tensor]:
            return None if all(v == unused for v in values) else device_tensor(values, dtype, device)

        return cls(
            temperature=device_tensor([1.0 if g else p.temperature for g, p in zip(greedy, params)], torch.float32,
                                      device),
            greedy=device_tensor(greedy, torch.bool, device),
            all_greedy=all(greedy),
            top_k=tensor(top_k, torch.long, vocab_size),
            top_p=tensor([p.top_p for p in params], torch.float32, 1.0),
            min_p=tensor([p.min_p for p in params], torch.float32, 0.0),
            generators={i: generators[r.request_id] for i, r in enumerate(requests)
                        if r.request_id in generators},
            max_num_logprobs=max(logprobs) if logprobs else None,
            logits_processors=_row_processors(requests),
            penalties=_penalties(requests, vocab_size, device),
            logit_bias=_logit_bias(requests, device),
            allowed=_allowed(requests, vocab_size, device),
            banned=_banned(requests, device),
            grammar=_grammar(requests, grammar_bitmasks or {}, device),
        )


def takes_raw_argmax(request: SamplingRequest, grammar_bitmasks: dict[str, torch.Tensor]) -> bool:
    """Whether sampling this request's rows takes the argmax of their logits as they come from the model, and
    no more: greedy, no logprobs, and nothing for any of the sampler's steps to apply (the rows SamplingMetadata.build
    gives no logits processor, penalty, bias, allowed or banned tokens, or grammar mask). No request with bad
    words is one: a verified position's outputs, the proposals before it included, may end in a bad word's
    first tokens where the request's own do not."""
    params = request.sampling_params
    return (params.sampling_type == SamplingType.GREEDY and params.logprobs is None
            and not params.logits_processors and not params.logit_bias and params.allowed_token_ids is None
            and not _penalized(params) and not params.bad_words_token_ids and not _min_tokens_banned(request)
            and request.request_id not in grammar_bitmasks)


def _row_processors(requests: list[SamplingRequest]) -> list[RowProcessor]:
    rows = []
    for i, request in enumerate(requests):
        for processor in request.sampling_params.logits_processors or []:
            prompt = list(request.prompt_token_ids) if _takes_prompt(processor) else None
            rows.append(RowProcessor(i, processor, prompt, list(request.output_token_ids)))
    return rows


def _takes_prompt(processor: Callable[..., Any]) -> bool:
    """(prompt_ids, output_ids, logits) processors have three parameters; (output_ids, logits) ones two."""
    return len(inspect.signature(processor).parameters) == 3


def _penalized(params: SamplingParams) -> bool:
    return params.presence_penalty != 0 or params.frequency_penalty != 0 or params.repetition_penalty != 1


def _penalties(requests: list[SamplingRequest], vocab_size: int, device: torch.device) -> Optional[Penalties]:
    params = [r.sampling_params for r in requests]
    if not any(_penalized(p) for p in params):
        return None

    def padded(lists: list[list[int]]) -> torch.Tensor:
        width = max(1, max(len(ids) for ids in lists))
        return device_tensor([ids + [vocab_size] * (width - len(ids)) for ids in lists], torch.long, device)

    def values(name: str) -> torch.Tensor:
        return device_tensor([getattr(p, name) for p in params], torch.float32, device)

    return Penalties(values("presence_penalty"), values("frequency_penalty"), values("repetition_penalty"),
                     padded([r.prompt_token_ids for r in requests]), padded([r.output_token_ids for r in requests]))


def _logit_bias(requests: list[SamplingRequest], device: torch.device
                ) -> Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    entries = [(i, token, bias) for i, r in enumerate(requests)
               for token, bias in (r.sampling_params.logit_bias or {}).items()]
    if not entries:
        return None
    rows, tokens, biases = zip(*entries)
    return (device_tensor(rows, torch.long, device), device_tensor(tokens, torch.long, device),
            device_tensor(biases, torch.float32, device))


def _allowed(requests: list[SamplingRequest], vocab_size: int, device: torch.device
             ) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    rows = [i for i, r in enumerate(requests) if r.sampling_params.allowed_token_ids is not None]
    if not rows:
        return None
    mask = torch.zeros(len(rows), vocab_size, dtype=torch.bool, device=device)
    for j, i in enumerate(rows):
        mask[j, requests[i].sampling_params.allowed_token_ids] = True
    return device_tensor(rows, torch.long, device), mask


def _banned(requests: list[SamplingRequest], device: torch.device) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    entries = [(i, token) for i, r in enumerate(requests) for token in _min_tokens_banned(r) | _bad_word_ends(r)]
    if not entries:
        return None
    rows, tokens = zip(*entries)
    return device_tensor(rows, torch.long, device), device_tensor(tokens, torch.long, device)


def _min_tokens_banned(request: SamplingRequest) -> set[int]:
    """Before min_tokens outputs no stop token may be sampled: EOS, stop_token_ids and extra EOS ids."""
    params = request.sampling_params
    if request.num_output_tokens >= params.min_tokens:
        return set()
    ids = set(params.all_stop_token_ids)
    if request.eos_token_id is not None and not params.ignore_eos:
        ids.add(request.eos_token_id)
    return ids


def _bad_word_ends(request: SamplingRequest) -> set[int]:
    """The last token of every bad word whose other tokens the output ends with (always, for one-token words)."""
    output = request.output_token_ids
    banned = set()
    for word in request.sampling_params.bad_words_token_ids:
        prefix = word[:-1]
        if len(prefix) <= len(output) and output[len(output) - len(prefix):] == prefix:
            banned.add(word[-1])
    return banned


def _grammar(requests: list[SamplingRequest], bitmasks: dict[str, torch.Tensor], device: torch.device
             ) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """Each request's masks are [rows, vocab/32]: a batch row takes the next unused one of its request's (one
    row per request in plain sampling; one per verified position with speculative decoding)."""
    rows, masks, used = [], [], {}
    for i, request in enumerate(requests):
        mask = bitmasks.get(request.request_id)
        if mask is not None:
            j = used[request.request_id] = used.get(request.request_id, -1) + 1
            rows.append(i)
            masks.append(mask[j])
    if not rows:
        return None
    return device_tensor(rows, torch.long, device), device_tensor(torch.stack(masks), torch.int32, device)
