"""From a request's JSON fields to native SamplingParams: the engine never sees the API's shapes."""
from __future__ import annotations

from typing import Optional

from pagedllm.entrypoints.openai.errors import APIError
from pagedllm.entrypoints.openai.protocol import SamplingFields
from pagedllm.sampling_params import RequestOutputKind, SamplingParams

_GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


def to_sampling_params(request: SamplingFields, defaults: SamplingParams, max_tokens: int,
                       logprobs: Optional[int], prompt_logprobs: Optional[int]) -> SamplingParams:
    """SamplingParams for `request`; fields it leaves unset take the model's generation-config defaults.
    Invalid values raise ValueError from SamplingParams, which the server answers with 400."""
    _reject_guided(request)
    if request.stream_options is not None and not request.stream:
        raise APIError("Stream options can only be defined when `stream=True`.", param="stream_options")

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
        logit_bias=logit_bias, allowed_token_ids=request.allowed_token_ids)


def _reject_guided(request: SamplingFields) -> None:
    asked = [name for name in _GUIDED_FIELDS if getattr(request, name) is not None]
    if request.response_format is not None and request.response_format.type != "text":
        asked.append("response_format")
    if asked:
        raise APIError(f"Guided decoding ({', '.join(asked)}) is not supported by this server yet.",
                       param=asked[0])
