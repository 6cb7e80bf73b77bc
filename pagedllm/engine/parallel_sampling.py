"""n > 1 and best_of: one request fanned out to sub-requests whose completions come back as one output."""
from __future__ import annotations

import dataclasses
from typing import Iterator, Optional

from pagedllm.outputs import CompletionOutput, RequestOutput
from pagedllm.sampling_params import RequestOutputKind, SamplingParams


class ParentRequest:
    """Sub-request i is `{id}_parallel_sample_{i}` (seed + i when seeded); each step the completions its
    sub-requests produced are gathered into one RequestOutput. With best_of > n the best n by cumulative
    logprob are kept, which is only known at the end, so such a request reports once, when finished."""

    def __init__(self, request_id: str, params: SamplingParams) -> None:
        self.request_id = request_id
        self.params = params
        self.num_children = max(params.n, params.best_of or 1)
        self.keeps_best = self.num_children > params.n
        self.latest: dict[int, CompletionOutput] = {}
        self.unfinished = set(range(self.num_children))
        self.step_completions: list[CompletionOutput] = []
        self.last_output: Optional[RequestOutput] = None
        self.prompt_logprobs = None
        self.sent_first = False

    @staticmethod
    def needed(params: SamplingParams) -> bool:
        return params.n > 1 or (params.best_of or 1) > 1

    def child_id(self, index: int) -> str:
        return f"{self.request_id}_parallel_sample_{index}"

    def children(self) -> Iterator[tuple[int, str, SamplingParams]]:
        for index in range(self.num_children):
            params = self.params.clone()
            params.n, params.best_of = 1, None
            if params.seed is not None:
                params.seed += index
            if self.keeps_best:
                params.output_kind = RequestOutputKind.FINAL_ONLY  # only whole completions can be ranked
                if params.logprobs is None:
                    params.logprobs = 0  # ranking needs each sampled token's logprob
            yield index, self.child_id(index), params

    def record(self, index: int, output: RequestOutput) -> None:
        """Take sub-request `index`'s output of this step."""
        completion = dataclasses.replace(output.outputs[0], index=index)
        if completion.finished():
            self.unfinished.discard(index)
        self.latest[index] = completion
        self.step_completions.append(completion)
        self.last_output = output
        if self.prompt_logprobs is None and output.prompt_logprobs:
            self.prompt_logprobs = output.prompt_logprobs

    @property
    def finished(self) -> bool:
        return not self.unfinished

    def collect(self) -> Optional[RequestOutput]:
        """The one RequestOutput for what was recorded this step, or None when there is nothing to report."""
        step, self.step_completions = self.step_completions, []
        kind = self.params.output_kind
        if not step or (not self.finished and (kind == RequestOutputKind.FINAL_ONLY or self.keeps_best)):
            return None
        if self.finished and self.keeps_best:
            outputs = self._best()
        elif kind == RequestOutputKind.DELTA:
            outputs = step
        else:
            outputs = [self.latest[i] for i in sorted(self.latest)]
        with_prompt = kind != RequestOutputKind.DELTA or not self.sent_first
        self.sent_first = True
        last = self.last_output
        return RequestOutput(
            request_id=self.request_id, prompt=last.prompt if with_prompt else None,
            prompt_token_ids=last.prompt_token_ids if with_prompt else None,
            prompt_logprobs=self.prompt_logprobs if with_prompt else None, outputs=outputs,
            finished=self.finished, metrics=last.metrics, lora_request=last.lora_request,
            num_cached_tokens=last.num_cached_tokens)

    def _best(self) -> list[CompletionOutput]:
        ranked = sorted(self.latest.values(), key=lambda c: c.cumulative_logprob or 0.0, reverse=True)
        keep_logprobs = self.params.logprobs is not None
        return [dataclasses.replace(c, index=i, logprobs=c.logprobs if keep_logprobs else None)
                for i, c in enumerate(ranked[:self.params.n])]
