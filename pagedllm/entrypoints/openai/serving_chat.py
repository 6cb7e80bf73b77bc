"""POST /v1/chat/completions: messages rendered by the chat template, one assistant reply per sample."""
from __future__ import annotations

from typing import AsyncIterator

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from pagedllm.entrypoints.openai.errors import APIError
from pagedllm.entrypoints.openai.logprobs import TokenNamer, chat_logprobs
from pagedllm.entrypoints.openai.protocol import (AssistantMessage, ChatChoice, ChatChunkChoice,
                                                  ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse,
                                                  ChatLogProbs, DeltaMessage, UsageInfo)
from pagedllm.entrypoints.openai.sampling import to_sampling_params
from pagedllm.entrypoints.openai.serving_engine import OpenAIServing
from pagedllm.entrypoints.openai.sse import event_stream, start_stream
from pagedllm.outputs import CompletionOutput, RequestOutput


class OpenAIServingChat(OpenAIServing):
    async def create_chat_completion(self, request: ChatCompletionRequest, raw_request: Request) -> Response:
        model = self.model_name(request.model)
        top = request.top_logprobs or 0
        if top and not request.logprobs:
            raise APIError("when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
        self.check_token_ids(request.stop_token_ids, "stop_token_ids")
        text = await self.render_chat(request.messages, request.add_generation_prompt,
                                      request.continue_final_message, request.chat_template, request.tools,
                                      request.chat_template_kwargs)
        prompt = await self.tokenize(text, request.add_special_tokens, request.truncate_prompt_tokens, "messages")
        num_prompt_tokens = len(prompt["prompt_token_ids"])
        max_tokens = self.max_tokens(num_prompt_tokens, request.max_completion_tokens or request.max_tokens)
        params = to_sampling_params(request, self.default_params, max_tokens, top if request.logprobs else None,
                                    request.prompt_logprobs)
        request_id = f"chatcmpl-{request.request_id}"
        stream = self.engine.generate(prompt, params, request_id, priority=request.priority,
                                      trace_headers=self.trace_headers(raw_request),
                                      lora_request=self.lora_request(request.model))
        outputs = self.outputs(stream, raw_request, max(request.n, request.best_of or 1))
        name = TokenNamer(self.tokenizer, request.return_tokens_as_token_ids)
        if request.stream:
            chunks = _ChunkBuilder(request_id, model, request, name, num_prompt_tokens)
            return StreamingResponse(event_stream(await start_stream(outputs), chunks.chunks),
                                     media_type="text/event-stream")
        final = None
        async for final in outputs:
            pass
        choices = [ChatChoice(index=c.index, message=AssistantMessage(content=c.text),
                              logprobs=self._logprobs(request, c, name), finish_reason=c.finish_reason,
                              stop_reason=c.stop_reason) for c in final.outputs]
        completion_tokens = sum(len(c.token_ids) for c in final.outputs)
        usage = UsageInfo(prompt_tokens=num_prompt_tokens, completion_tokens=completion_tokens,
                          total_tokens=num_prompt_tokens + completion_tokens)
        return JSONResponse(ChatCompletionResponse(id=request_id, model=model, choices=choices,
                                                   usage=usage).model_dump())

    @staticmethod
    def _logprobs(request: ChatCompletionRequest, completion: CompletionOutput, name: TokenNamer
                  ) -> ChatLogProbs | None:
        if not request.logprobs or completion.logprobs is None:
            return None
        return ChatLogProbs(content=chat_logprobs(completion.token_ids, completion.logprobs,
                                                  request.top_logprobs or 0, name))


class _ChunkBuilder:
    """The chunks of a streamed reply: the role first for each choice, then content deltas, then usage."""

    def __init__(self, request_id: str, model: str, request: ChatCompletionRequest, name: TokenNamer,
                 num_prompt_tokens: int) -> None:
        self.request_id, self.model, self.request, self.name = request_id, model, request, name
        self.num_prompt_tokens = num_prompt_tokens
        self.completion_tokens = 0

    def _chunk(self, choices: list[ChatChunkChoice]) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.request_id, model=self.model, choices=choices)

    def _usage(self) -> UsageInfo:
        return UsageInfo(prompt_tokens=self.num_prompt_tokens, completion_tokens=self.completion_tokens,
                         total_tokens=self.num_prompt_tokens + self.completion_tokens)

    async def chunks(self, outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[ChatCompletionChunk]:
        options = self.request.stream_options
        continuous = bool(options and options.include_usage and options.continuous_usage_stats)
        yield self._chunk([ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
                           for i in range(self.request.n)])
        async for output in outputs:
            for completion in output.outputs:
                if not (completion.text or completion.token_ids or completion.finish_reason):
                    continue
                self.completion_tokens += len(completion.token_ids)
                chunk = self._chunk([ChatChunkChoice(
                    index=completion.index, delta=DeltaMessage(content=completion.text),
                    logprobs=OpenAIServingChat._logprobs(self.request, completion, self.name),
                    finish_reason=completion.finish_reason, stop_reason=completion.stop_reason)])
                if continuous:
                    chunk.usage = self._usage()
                yield chunk
        if options and options.include_usage:
            usage_chunk = self._chunk([])
            usage_chunk.usage = self._usage()
            yield usage_chunk
