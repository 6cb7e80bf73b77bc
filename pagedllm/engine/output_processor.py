"""From sampled tokens to RequestOutputs: detokenize, check stops, collect logprobs, apply the output kind."""
from __future__ import annotations

import time
from typing import Any, Iterable, NamedTuple, Optional

from pagedllm.core.request import RequestStatus
from pagedllm.core.runner_output import ModelRunnerOutput, TokenLogprobs
from pagedllm.engine.parallel_sampling import ParentRequest
from pagedllm.engine.request_state import RequestState
from pagedllm.engine.stop_checker import check_stop, held_back_length
from pagedllm.outputs import CompletionOutput, Logprob, RequestOutput
from pagedllm.sample.sampler import NO_TOKEN_LEFT
from pagedllm.sampling_params import RequestOutputKind

# How the reason of a request that failed because its parameters masked every token begins.
NO_TOKEN_ALLOWED = "its parameters leave no token to sample"


def is_client_failure(reason: object) -> bool:
    """Whether a failed request's reason blames its own parameters: its client's mistake (a 400 over HTTP,
    request_streams.RequestParametersError), not the server's."""
    return str(reason).startswith(NO_TOKEN_ALLOWED)


class ProcessedStep(NamedTuple):
    """What a step's tokens made: the outputs after each token (one list unless multi-step streams them), the
    requests that finished with their status, and how many new tokens each request kept: those after a stop
    in a multi-step group or an accepted speculative run are dropped, as plain decoding never sampled them."""

    outputs_by_token: list[list[RequestOutput]]
    finished: dict[str, RequestStatus]
    num_new_tokens: dict[str, int]


class OutputProcessor:
    """Turns a step's results into the RequestOutputs of the requests' records (engine/request_state.py)."""

    def __init__(self, tokenizer: Any, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self._token_text: dict[int, str] = {}

    def set_tokenizer(self, tokenizer: Any) -> None:
        """Decode logprob tokens with `tokenizer` from now on (each request's text uses the tokenizer it began
        with)."""
        self.tokenizer = tokenizer
        self._token_text.clear()

    def process(self, states: list[RequestState], result: ModelRunnerOutput, failed: dict[str, str],
                each_token: bool = True) -> ProcessedStep:
        """Outputs of this step, the requests that finished and the tokens each kept. The requests in `failed`
        (id -> why) finish with an error, as does one whose detokenizing or stop check raises. With several
        tokens per request (multi-step) list i holds the outputs after each request's (i+1)-th new token
        (`each_token`); otherwise there is one list."""
        by_token: list[list[tuple[RequestState, RequestOutput]]] = []
        finished, num_new_tokens = {}, {}
        for state in states:
            request_id = state.request_id
            sampled = request_id in result.sampled_token_ids
            if not sampled and request_id not in failed and request_id not in result.prompt_logprobs:
                continue
            earlier: Optional[list[Optional[RequestOutput]]] = [] if each_token else None
            num_output_tokens = state.request.num_output_tokens  # the step's tokens already appended
            status = self._advance(state, result, failed, earlier)
            if sampled:
                dropped = num_output_tokens - state.request.num_output_tokens
                num_new_tokens[request_id] = len(result.sampled_token_ids[request_id]) - dropped
            if status is None and not sampled:  # a prompt chunk's logprobs: kept for the first output
                continue
            if status is not None:
                finished[request_id] = status
            for i, output in enumerate([*(earlier or []), self.make_output(state, status)]):
                by_token.extend([] for _ in range(i + 1 - len(by_token)))
                if output is not None:
                    by_token[i].append((state, output))
        return ProcessedStep([_gather(entries) for entries in by_token], finished, num_new_tokens)

    def final_output(self, state: RequestState, status: RequestStatus) -> list[RequestOutput]:
        """The output of a request finished outside a step's tokens (one that could never fit)."""
        output = self.make_output(state, status)
        if state.parent is None:
            return [output]
        parent, index = state.parent
        parent.record(index, output)
        return _collect([parent])

    def _advance(self, state: RequestState, result: ModelRunnerOutput, failed: dict[str, str],
                 earlier: Optional[list[Optional[RequestOutput]]] = None) -> Optional[RequestStatus]:
        """Take the request's prompt logprobs and tokens of this step; its status after them, or
        FINISHED_ERROR (with why as its stop reason) when it failed in the workers (after the tokens it sampled
        before failing, unless one of them stopped it) or fails here. `earlier`, if given, receives the output
        after each new token but the last."""
        request_id = state.request_id
        try:
            entry = result.prompt_logprobs.get(request_id)
            if entry is not None and request_id not in failed:
                state.prompt_logprobs.extend(self._logprob_dicts(entry, state.request.sampling_params.detokenize))
            status = None
            if request_id in result.sampled_token_ids:
                status = self._add_tokens(state, len(result.sampled_token_ids[request_id]),
                                          result.logprobs.get(request_id), earlier)
            if status is not None or request_id not in failed:
                return status
        except Exception as error:  # this request's own text or stop check: it fails alone
            failed[request_id] = f"processing its output raised {type(error).__name__}: {error}"
        reason = failed[request_id]
        state.request.stop_reason = _no_token_allowed(state) if reason == NO_TOKEN_LEFT else reason
        return RequestStatus.FINISHED_ERROR

    def _add_tokens(self, state: RequestState, num_new: int, logprobs: Optional[TokenLogprobs],
                    earlier: Optional[list[Optional[RequestOutput]]] = None) -> Optional[RequestStatus]:
        """Take a step's new tokens (already appended) one at a time, as plain decoding would: a stop at one of
        them drops those after it."""
        if num_new == 1:
            return self._add_token(state, logprobs)
        status = None
        for i, token in enumerate(state.request.pop_output_tokens(num_new)):
            state.request.append_output_token(token)
            entry = None if logprobs is None else TokenLogprobs(logprobs.token_ids[i:i + 1],
                                                               logprobs.logprobs[i:i + 1], logprobs.ranks[i:i + 1])
            status = self._add_token(state, entry)
            if status is not None:
                break
            if earlier is not None and i < num_new - 1:
                earlier.append(self.make_output(state, None))
        return status

    def _add_token(self, state: RequestState, logprobs: Optional[TokenLogprobs]) -> Optional[RequestStatus]:
        request = state.request
        new_text = state.detokenizer.add_token(request.output_token_ids[-1]) if state.detokenizer else ""
        if logprobs is not None and state.logprobs is not None:
            state.logprobs.extend(self._logprob_dicts(logprobs, request.sampling_params.detokenize))
            state.cumulative_logprob += logprobs.logprobs[0][0]
        status, state.text = check_stop(request, state.text + new_text, len(new_text), self.max_model_len)
        return status

    def _logprob_dicts(self, entry: TokenLogprobs, detokenize: bool) -> list[dict[int, Logprob]]:
        """Logprob entries; their decoded_token is None when the request asked for no detokenization."""
        dicts = []
        for ids, values, rank in zip(entry.token_ids, entry.logprobs, entry.ranks):
            top = {tid: Logprob(value, i, self._decode_token(tid, detokenize)) for i, (tid, value)
                   in enumerate(zip(ids[1:], values[1:]), start=1)}
            top.setdefault(ids[0], Logprob(values[0], rank, self._decode_token(ids[0], detokenize)))
            dicts.append(top)
        return dicts

    def _decode_token(self, token_id: int, detokenize: bool) -> Optional[str]:
        if self.tokenizer is None or not detokenize:
            return None
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id])
        return text

    def make_output(self, state: RequestState, status: Optional[RequestStatus]) -> Optional[RequestOutput]:
        """The RequestOutput the request's output kind asks for now, or None."""
        request, params = state.request, state.request.sampling_params
        finished = status is not None
        if finished:
            state.metrics.finished_time = time.time()
        kind = params.output_kind
        if kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        text = state.text
        if not finished and params.stop and not params.include_stop_str_in_output:
            text = text[:len(text) - held_back_length(text, params.stop)]
        delta = kind == RequestOutputKind.DELTA
        first_token = state.sent_tokens if delta else 0
        completion = CompletionOutput(
            index=0, text=text[state.sent_text:] if delta else text,
            token_ids=request.output_token_ids[first_token:],
            cumulative_logprob=state.cumulative_logprob,
            logprobs=state.logprobs[first_token:] if state.logprobs is not None else None,
            finish_reason=status.finish_reason if finished else None,
            stop_reason=request.stop_reason, lora_request=request.lora_request)
        prompt_logprobs = state.prompt_logprobs
        if delta:
            if not completion.text and not completion.token_ids and not finished:
                return None
            state.sent_tokens, state.sent_text = request.num_output_tokens, len(text)
            if prompt_logprobs is not None:
                prompt_logprobs, state.sent_prompt_logprobs = (prompt_logprobs[state.sent_prompt_logprobs:],
                                                               len(prompt_logprobs))
        first = not delta or first_token == 0
        return RequestOutput(
            request_id=request.request_id, prompt=state.prompt if first else None,
            prompt_token_ids=request.prompt_token_ids if first else None,
            prompt_logprobs=prompt_logprobs, outputs=[completion], finished=finished, metrics=state.metrics,
            lora_request=request.lora_request, num_cached_tokens=request.num_cached_tokens)


def _gather(entries: list[tuple[RequestState, RequestOutput]]) -> list[RequestOutput]:
    """The outputs of requests on their own, then those of n > 1 requests gathered from their samples'."""
    outputs, parents = [], {}
    for state, output in entries:
        if state.parent is None:
            outputs.append(output)
            continue
        parent, index = state.parent
        parent.record(index, output)
        parents[parent.request_id] = parent
    return outputs + _collect(parents.values())


def _collect(parents: Iterable[ParentRequest]) -> list[RequestOutput]:
    """The n > 1 requests' outputs of what their samples recorded this step."""
    return [output for output in (parent.collect() for parent in parents) if output is not None]


def _no_token_allowed(state: RequestState) -> str:
    """Why every token of the request's logits was masked out, naming its parameters that mask tokens; the
    sampler's plain reason where none does (logits of -inf from the model)."""
    params, produced = state.request.sampling_params, state.request.num_output_tokens
    masking = [name for name, masks in (("guided_decoding", params.guided_decoding is not None),
                                        ("allowed_token_ids", bool(params.allowed_token_ids)),
                                        ("bad_words", bool(params.bad_words)),
                                        ("logits_processors", bool(params.logits_processors))) if masks]
    if produced < params.min_tokens:
        masking.append(f"min_tokens={params.min_tokens} (no EOS or stop token before it; {produced} so far)")
    return f"{NO_TOKEN_ALLOWED}: {', '.join(masking)}" if masking else NO_TOKEN_LEFT
