"""From a request's JSON fields to native SamplingParams: the engine never sees the API's shapes."""
from __future__ import annotations

from typing import Optional

from pagedllm.entrypoints.openai.errors import APIError
from pagedllm.entrypoints.openai.protocol import SamplingFields
from pagedllm.sampling_params import GuidedDecodingParams, RequestOutputKind, SamplingParams

_GUIDED_FIELDS = ("json", "regex", "choice", "grammar")


def to_sampling_params(request: SamplingFields, defaults: SamplingParams, max_tokens: int,
                       logprobs: Optional[int], prompt_logprobs: Optional[int]) -> SamplingParams:
    """SamplingParams for `request`; fields it leaves unset take the model's generation-config defaults.
    Invalid values raise ValueError from SamplingParams, which the server answers with 400."""
    if request.stream_options is not None and not request.stream:
        raise APIError("Stream options can only be defined when `stream=True`.", param="stream_options")
    if request.stream and request.best_of is not None and request.best_of != request.n:
        raise APIError(f"best_of must equal n when streaming (the best of several samples is known only when all "
                       f"have finished): got best_of={request.best_of} and n={request.n}.", param="best_of")

    def pick(name: str) -> object:
        value = getattr(request, name)
        return getattr(defaults, name) if value is None else value

    logit_bias = None
    if request.logit_bias is not None:
        try:
            logit_bias = {int(token): bias for token, bias in request.logit_bias.items()}
        except ValueError:
            raise APIError("logit_bias keys must be token ids.", param="logit_bias") from None
    return SamplingParams(
        n=request.n, best_of=request.best_of, presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty, repetition_penalty=pick("repetition_penalty"),
        temperature=pick("temperature"), top_p=pick("top_p"), top_k=pick("top_k"), min_p=pick("min_p"),
        seed=request.seed, stop=request.stop, stop_token_ids=request.stop_token_ids,
        bad_words=request.bad_words, include_stop_str_in_output=request.include_stop_str_in_output,
        ignore_eos=request.ignore_eos, max_tokens=max_tokens, min_tokens=request.min_tokens,
        logprobs=logprobs, prompt_logprobs=prompt_logprobs, skip_special_tokens=request.skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
        logit_bias=logit_bias, allowed_token_ids=request.allowed_token_ids,
        guided_decoding=guided_decoding(request))


def guided_decoding(request: SamplingFields) -> Optional[GuidedDecodingParams]:
    """The constraint that `response_format` or a `guided_*` field asks for; more than one is a 400."""
    kinds: dict[str, object] = {}
    response_format = request.response_format
    if response_format is not None and response_format.type == "json_object":
        kinds["json_object"] = True
    elif response_format is not None and response_format.type == "json_schema":
        schema = (response_format.json_schema or {}).get("schema")
        if schema is None:
            raise APIError("response_format of type json_schema needs `json_schema.schema`.",
                           param="response_format")
        kinds["json"] = schema
    for name in _GUIDED_FIELDS:
        value = getattr(request, f"guided_{name}")
        if value is not None:
            kinds[name] = value
    if not kinds:
        return None
    if len(kinds) > 1:
        raise APIError(f"You can only use one kind of guided decoding, got {sorted(kinds)}.", param="response_format")
    return GuidedDecodingParams(**kinds, backend=request.guided_decoding_backend,
                                whitespace_pattern=request.guided_whitespace_pattern)
