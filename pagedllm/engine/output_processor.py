"""From sampled tokens to RequestOutputs: detokenize, check stops, collect logprobs, apply the output kind."""
from __future__ import annotations

import time
from typing import Any, Iterable, Optional

from pagedllm.core.request import Request, RequestStatus
from pagedllm.engine.detokenizer import IncrementalDetokenizer
from pagedllm.engine.parallel_sampling import ParentRequest
from pagedllm.engine.stop_checker import check_stop, held_back_length
from pagedllm.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from pagedllm.sampling_params import RequestOutputKind
from pagedllm.worker.model_runner import ModelRunnerOutput, TokenLogprobs


class RequestState:
    """What the engine keeps of a request beside the scheduler's view: text, logprobs, timings."""

    def __init__(self, request: Request, prompt: Optional[str], tokenizer: Any,
                 parent: Optional[tuple[ParentRequest, int]] = None) -> None:
        params = request.sampling_params
        self.request = request
        self.prompt = prompt
        self.parent = parent  # (the n > 1 request this one is a sample of, its index)
        self.detokenizer = (IncrementalDetokenizer(tokenizer, request.prompt_token_ids, params.skip_special_tokens,
                                                   params.spaces_between_special_tokens)
                            if tokenizer is not None and params.detokenize else None)
        self.text = ""
        self.logprobs: Optional[list[dict[int, Logprob]]] = [] if params.logprobs is not None else None
        self.cumulative_logprob: Optional[float] = 0.0 if params.logprobs is not None else None
        self.prompt_logprobs: Optional[list] = [None] if params.prompt_logprobs is not None else None
        self.metrics = RequestMetrics(arrival_time=request.arrival_time, last_token_time=request.arrival_time)
        self.sent_tokens = 0  # for DELTA outputs
        self.sent_text = 0
        self.sent_prompt_logprobs = 0


class OutputProcessor:
    def __init__(self, tokenizer: Any, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.states: dict[str, RequestState] = {}
        self.parents: dict[str, ParentRequest] = {}
        self._token_text: dict[int, str] = {}

    def set_tokenizer(self, tokenizer: Any) -> None:
        """Decode the requests added from now on with `tokenizer` (running ones keep their detokenizer)."""
        self.tokenizer = tokenizer
        self._token_text.clear()

    def add_request(self, request: Request, prompt: Optional[str],
                    parent: Optional[tuple[ParentRequest, int]] = None) -> None:
        self.states[request.request_id] = RequestState(request, prompt, self.tokenizer, parent)
        if parent is not None:
            self.parents[parent[0].request_id] = parent[0]

    def is_known(self, request_id: str) -> bool:
        return request_id in self.states or request_id in self.parents

    def request_ids(self, request_id: str) -> list[str]:
        """The engine requests behind a user's request id: itself, or the sub-requests of an n > 1 request."""
        parent = self.parents.get(request_id)
        if parent is None:
            return [request_id]
        return [parent.child_id(i) for i in range(parent.num_children)]

    def process(self, requests: list[Request], result: ModelRunnerOutput
                ) -> tuple[list[RequestOutput], dict[str, RequestStatus]]:
        """Outputs of this step, and the requests that finished with their status."""
        outputs, finished = [], {}
        parents: dict[str, ParentRequest] = {}
        for request in requests:
            state = self.states[request.request_id]
            if request.request_id in result.prompt_logprobs:
                state.prompt_logprobs.extend(self._logprob_dicts(result.prompt_logprobs[request.request_id],
                                                                 request.sampling_params.detokenize))
            if request.request_id not in result.sampled_token_ids:
                continue
            status = self._add_token(state, result.logprobs.get(request.request_id))
            if status is not None:
                finished[request.request_id] = status
            output = self.make_output(state, status)
            if output is not None and state.parent is not None:
                parent, index = state.parent
                parent.record(index, output)
                parents[parent.request_id] = parent
            elif output is not None:
                outputs.append(output)
        return outputs + self._collect(parents.values()), finished

    def finish_ignored(self, request: Request) -> list[RequestOutput]:
        """The output of a request that was finished without running."""
        state = self.finish(request.request_id)
        output = self.make_output(state, request.status)
        if state.parent is None:
            return [output]
        parent, index = state.parent
        parent.record(index, output)
        return self._collect([parent])

    def _collect(self, parents: Iterable[ParentRequest]) -> list[RequestOutput]:
        outputs = []
        for parent in parents:
            output = parent.collect()
            if output is not None:
                outputs.append(output)
            if parent.finished:
                self.parents.pop(parent.request_id, None)
        return outputs

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

    def finish(self, request_id: str) -> Optional[RequestState]:
        return self.states.pop(request_id, None)

    def abort(self, request_ids: list[str]) -> None:
        """Forget aborted requests, and the n > 1 requests they belong to."""
        for request_id in request_ids:
            state = self.finish(request_id)
            if state is not None and state.parent is not None:
                self.parents.pop(state.parent[0].request_id, None)
