"""POST /v1/completions: prompts in, one choice per prompt and sample, whole or as server-sent events."""
from __future__ import annotations

import functools
from typing import AsyncIterator, Union

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from pagedllm.entrypoints.openai.errors import APIError
from pagedllm.entrypoints.openai.logprobs import TokenNamer, completion_logprobs
from pagedllm.entrypoints.openai.protocol import (CompletionChoice, CompletionChunk, CompletionRequest,
                                                  CompletionResponse, UsageInfo)
from pagedllm.entrypoints.openai.sampling import to_sampling_params
from pagedllm.entrypoints.openai.serving_engine import OpenAIServing
from pagedllm.entrypoints.openai.sse import event_stream, prompt_logprobs_json, start_stream
from pagedllm.entrypoints.openai.streams import merge_async_iterators
from pagedllm.inputs import TokensPrompt
from pagedllm.outputs import CompletionOutput, RequestOutput


def _prompt_list(prompt: Union[str, list[str], list[int], list[list[int]]]) -> list[Union[str, list[int]]]:
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(p, (str, list)) for p in prompt):
        return list(prompt)
    return [prompt]


class OpenAIServingCompletion(OpenAIServing):
    async def create_completion(self, request: CompletionRequest, raw_request: Request) -> Response:
        model = self.model_name(request.model)
        if request.suffix is not None:
            raise APIError("suffix is not currently supported", param="suffix")
        self.check_token_ids(request.stop_token_ids, "stop_token_ids")
        prompts = [await self.tokenize(p, request.add_special_tokens, request.truncate_prompt_tokens)
                   for p in _prompt_list(request.prompt)]
        prompt_logprobs = request.prompt_logprobs
        if request.echo and request.logprobs is not None and prompt_logprobs is None:
            prompt_logprobs = request.logprobs  # echoed prompt tokens carry their logprobs too
        request_id = f"cmpl-{request.request_id}"
        streams = []
        for i, prompt in enumerate(prompts):
            max_tokens = self.max_tokens(len(prompt["prompt_token_ids"]), request.max_tokens)
            params = to_sampling_params(request, self.default_params, max_tokens, request.logprobs, prompt_logprobs)
            streams.append(self.engine.generate(prompt, params, f"{request_id}-{i}", priority=request.priority,
                                                trace_headers=self.trace_headers(raw_request),
                                                lora_request=self.lora_request(request.model)))
        samples = max(request.n, request.best_of or 1)
        outputs = self.outputs(merge_async_iterators(*streams), raw_request, len(prompts) * samples)
        builder = _ChoiceBuilder(request, prompts, TokenNamer(self.tokenizer, request.return_tokens_as_token_ids),
                                 self.tokenizer)
        if request.stream:
            to_chunks = functools.partial(self._chunks, request_id, model, request, builder)
            return StreamingResponse(event_stream(await start_stream(outputs), to_chunks),
                                     media_type="text/event-stream")
        finals: dict[int, RequestOutput] = {}
        async for index, output in outputs:
            finals[index] = output
        choices = [builder.choice(i, output, completion) for i, output in sorted(finals.items())
                   for completion in output.outputs]
        response = CompletionResponse(id=request_id, model=model, choices=sorted(choices, key=lambda c: c.index),
                                      usage=builder.usage())
        return JSONResponse(response.model_dump())

    async def _chunks(self, request_id: str, model: str, request: CompletionRequest, builder: "_ChoiceBuilder",
                      outputs: AsyncIterator[tuple[int, RequestOutput]]) -> AsyncIterator[CompletionChunk]:
        options = request.stream_options
        async for index, output in outputs:
            for completion in output.outputs:
                if not (completion.text or completion.token_ids or completion.finish_reason):
                    continue
                chunk = CompletionChunk(id=request_id, model=model, choices=[builder.choice(index, output, completion)])
                if options and options.include_usage and options.continuous_usage_stats:
                    chunk.usage = builder.usage()
                yield chunk
        if options and options.include_usage:
            yield CompletionChunk(id=request_id, model=model, choices=[], usage=builder.usage())


class _ChoiceBuilder:
    """Turns engine outputs into choices, keeping per-choice state (echo sent, text offset) and usage."""

    def __init__(self, request: CompletionRequest, prompts: list[TokensPrompt], name: TokenNamer,
                 tokenizer: object) -> None:
        self.request = request
        self.prompts = prompts
        self.name = name
        self.tokenizer = tokenizer
        self.offsets: dict[int, int] = {}  # choice index -> length of the text sent so far
        self.completion_tokens = 0

    def choice(self, prompt_index: int, output: RequestOutput, completion: CompletionOutput) -> CompletionChoice:
        request, prompt = self.request, self.prompts[prompt_index]
        index = prompt_index * request.n + completion.index
        first = index not in self.offsets
        offset = self.offsets.get(index, 0)
        text, token_ids = completion.text, list(completion.token_ids)
        logprobs = list(completion.logprobs or [])
        if request.echo and first:
            prompt_ids = prompt["prompt_token_ids"]
            text = prompt.get("prompt", None) or self.tokenizer.decode(prompt_ids)
            text += completion.text
            token_ids = prompt_ids + token_ids
            logprobs = list(output.prompt_logprobs or [None] * len(prompt_ids)) + logprobs
        self.completion_tokens += len(completion.token_ids)
        choice = CompletionChoice(index=index, text=text, finish_reason=completion.finish_reason,
                                  stop_reason=completion.stop_reason)
        if request.logprobs is not None:
            choice.logprobs = completion_logprobs(token_ids, logprobs, self.name, offset)
        if request.prompt_logprobs is not None and output.prompt_logprobs is not None and first:
            choice.prompt_logprobs = prompt_logprobs_json(output.prompt_logprobs)
        self.offsets[index] = offset + len(text)
        return choice

    def usage(self) -> UsageInfo:
        prompt_tokens = sum(len(p["prompt_token_ids"]) for p in self.prompts)
        return UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=self.completion_tokens,
                         total_tokens=prompt_tokens + self.completion_tokens)
