"""Whether a request stops after its newest token, checked in vLLM's order."""
from __future__ import annotations

from typing import Optional

from pagedllm.core.request import Request, RequestStatus


def check_stop(request: Request, text: str, new_text_len: int, max_model_len: int
               ) -> tuple[Optional[RequestStatus], str]:
    """Return (finished status or None, output text after any stop-string cut).

    Order: min_tokens (nothing stops before it), EOS unless ignore_eos, stop_token_ids, stop strings,
    model length, max_tokens.
    """
    params = request.sampling_params
    last = request.output_token_ids[-1]
    if request.num_output_tokens >= params.min_tokens:
        # The text of EOS or a stop token (seen with skip_special_tokens=False) is cut, as in vLLM.
        eos = not params.ignore_eos and last == request.eos_token_id
        if eos or last in params.all_stop_token_ids:
            request.stop_reason = None if eos else last
            if new_text_len and not params.include_stop_str_in_output:
                text = text[:-new_text_len]
            return RequestStatus.FINISHED_STOPPED, text
        cut = find_stop_string(text, new_text_len, params.stop, params.include_stop_str_in_output)
        if cut is not None:
            request.stop_reason, end = cut
            return RequestStatus.FINISHED_STOPPED, text[:end]
    if request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH_CAPPED, text
    if params.max_tokens is not None and request.num_output_tokens >= params.max_tokens:
        return RequestStatus.FINISHED_LENGTH_CAPPED, text
    return None, text


def find_stop_string(text: str, new_text_len: int, stops: list[str],
                     include_in_output: bool) -> Optional[tuple[str, int]]:
    """The first stop string that the new text completes, and where the output ends because of it."""
    if not new_text_len:
        return None
    for stop in stops:
        # A match must end inside the new text, so it starts at most len(stop) - 1 characters before it.
        index = text.find(stop, max(0, len(text) - new_text_len - len(stop) + 1))
        if index != -1:
            return stop, index + len(stop) if include_in_output else index
    return None


def held_back_length(text: str, stops: list[str]) -> int:
    """How many trailing characters could still become a stop string, and so are not shown yet."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest
