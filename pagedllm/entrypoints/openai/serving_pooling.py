"""The pooling endpoints: POST /v1/embeddings, /pooling, /classify, /score and /rerank.

Each turns its inputs into token prompts and native `PoolingParams`, runs one engine request per prompt and
shapes the pooled tensors as vLLM answers them. /score and /rerank score a pair by the cosine similarity of its
embeddings, or, on a cross-encoder (a one-label classifier), in one pass over the pair. A model run for
generation refuses them all with a 400.
"""
from __future__ import annotations

import base64
from http import HTTPStatus
from typing import Any, Optional, Union

import torch
from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from pagedllm.engine.pooling import is_cross_encoder, pair_request
from pagedllm.entrypoints.openai.errors import APIError
from pagedllm.entrypoints.openai.protocol_pooling import (ClassificationData, ClassificationRequest,
                                                          ClassificationResponse, EmbeddingData, EmbeddingRequest,
                                                          EmbeddingResponse, PoolingData, PoolingRequest,
                                                          PoolingResponse, PoolingUsage, RerankDocument,
                                                          RerankRequest, RerankResponse, RerankResult,
                                                          RerankUsage, ScoreData, ScoreRequest, ScoreResponse)
from pagedllm.entrypoints.openai.serving_engine import OpenAIServing, ServingContext
from pagedllm.entrypoints.openai.streams import merge_async_iterators
from pagedllm.inputs import TokensPrompt
from pagedllm.outputs import PoolingRequestOutput
from pagedllm.pooling_params import PoolingParams

_EMBEDDING_TASKS = ("embed",)
_CLASSIFY_TASKS = ("classify", "score")


class OpenAIServingPooling(OpenAIServing):
    def __init__(self, context: ServingContext, model_config: Any) -> None:
        super().__init__(context)
        self.model_config = model_config
        self.task = model_config.task
        self.cross_encoder = is_cross_encoder(model_config)
        self.id2label = getattr(model_config.hf_config, "id2label", None) or {}

    # --- endpoints ----------------------------------------------------------------------------------------

    async def create_embedding(self, request: EmbeddingRequest, raw_request: Request) -> Response:
        model = self._check(request.model, "Embeddings", _EMBEDDING_TASKS)
        params = PoolingParams(dimensions=request.dimensions, normalize=request.normalize, task="embed")
        prompts = await self._prompts(request.input, request.add_special_tokens, request.truncate_prompt_tokens)
        outputs = await self._pool(prompts, params, f"embd-{request.request_id}", raw_request, request.priority)
        data = [EmbeddingData(index=i, embedding=_encode(o.outputs.data, request.encoding_format))
                for i, o in enumerate(outputs)]
        return _json(EmbeddingResponse(id=f"embd-{request.request_id}", model=model, data=data,
                                       usage=_usage(outputs)))

    async def create_pooling(self, request: PoolingRequest, raw_request: Request) -> Response:
        model = self._check(request.model, "Pooling", _EMBEDDING_TASKS + _CLASSIFY_TASKS + ("reward",))
        params = PoolingParams(task="encode")
        if request.dimensions is not None or request.normalize is not None:
            raise APIError("dimensions and normalize are parameters of /v1/embeddings, not of /pooling.",
                           param="dimensions" if request.dimensions is not None else "normalize")
        prompts = await self._prompts(request.input, request.add_special_tokens, request.truncate_prompt_tokens)
        outputs = await self._pool(prompts, params, f"pool-{request.request_id}", raw_request, request.priority)
        data = [PoolingData(index=i, data=_encode(o.outputs.data, request.encoding_format))
                for i, o in enumerate(outputs)]
        return _json(PoolingResponse(id=f"pool-{request.request_id}", model=model, data=data, usage=_usage(outputs)))

    async def create_classify(self, request: ClassificationRequest, raw_request: Request) -> Response:
        model = self._check(request.model, "Classification", _CLASSIFY_TASKS)
        prompts = await self._prompts(request.input, True, request.truncate_prompt_tokens)
        params = PoolingParams(activation=request.activation, task="classify")
        outputs = await self._pool(prompts, params, f"classify-{request.request_id}", raw_request, request.priority)
        data = []
        for i, output in enumerate(outputs):
            probs = output.outputs.data.tolist()
            label = self.id2label.get(int(output.outputs.data.argmax()))
            data.append(ClassificationData(index=i, label=label, probs=probs, num_classes=len(probs)))
        return _json(ClassificationResponse(id=f"classify-{request.request_id}", model=model, data=data,
                                            usage=_usage(outputs)))

    async def create_score(self, request: ScoreRequest, raw_request: Request) -> Response:
        model = self._check_scoring(request.model, "Score")
        firsts = [request.text_1] if isinstance(request.text_1, str) else list(request.text_1)
        seconds = [request.text_2] if isinstance(request.text_2, str) else list(request.text_2)
        scores, outputs = await self._scores(firsts, seconds, request, f"score-{request.request_id}", raw_request)
        data = [ScoreData(index=i, score=score) for i, score in enumerate(scores)]
        return _json(ScoreResponse(id=f"score-{request.request_id}", model=model, data=data, usage=_usage(outputs)))

    async def create_rerank(self, request: RerankRequest, raw_request: Request) -> Response:
        model = self._check_scoring(request.model, "Rerank")
        if not request.documents:
            raise APIError("documents must not be empty.", param="documents")
        scores, outputs = await self._scores([request.query], request.documents, request,
                                             f"rerank-{request.request_id}", raw_request)
        order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
        results = [RerankResult(index=i, document=RerankDocument(text=request.documents[i]), relevance_score=scores[i])
                   for i in order[:request.top_n or len(order)]]
        return _json(RerankResponse(id=f"rerank-{request.request_id}", model=model,
                                    usage=RerankUsage(total_tokens=_usage(outputs).total_tokens), results=results))

    def refuse_generation(self, api: str) -> None:
        """A pooling model cannot generate: the text APIs answer 400 before any work."""
        if self.task != "generate":
            raise APIError(f"The model does not support the {api} API: it runs task={self.task!r} and takes "
                           "PoolingParams; text generation needs a model served with --task generate.",
                           HTTPStatus.BAD_REQUEST, param="model")

    # --- shared steps -------------------------------------------------------------------------------------

    def _check(self, requested: Optional[str], api: str, tasks: tuple[str, ...]) -> str:
        model = self.model_name(requested)
        if self.task not in tasks:
            raise APIError(f"The model does not support the {api} API: it runs task={self.task!r}; serve a model "
                           f"with --task {tasks[0]} for it.", HTTPStatus.BAD_REQUEST, param="model")
        return model

    def _check_scoring(self, requested: Optional[str], api: str) -> str:
        """Scores need an embedding model or a cross-encoder."""
        model = self._check(requested, api, _EMBEDDING_TASKS + _CLASSIFY_TASKS)
        if self.task != "embed" and not self.cross_encoder:
            raise APIError(f"The model does not support the {api} API: its classifier has "
                           f"{self.model_config.hf_config.num_labels} labels, and scoring a pair in one pass needs "
                           "one (a cross-encoder).", HTTPStatus.BAD_REQUEST, param="model")
        return model

    async def _prompts(self, inputs: Union[str, list], add_special_tokens: bool,
                       truncate_prompt_tokens: Optional[int]) -> list[TokensPrompt]:
        """One token prompt per input: a string, a list of strings, a list of token ids, or a list of those."""
        if isinstance(inputs, str) or (inputs and all(isinstance(t, int) for t in inputs)):
            inputs = [inputs]
        if not inputs:
            raise APIError("input must not be empty.", param="input")
        prompts = []
        for item in inputs:
            if not item:
                raise APIError("input contains an empty text or token list; every input needs at least one "
                               "token.", param="input")
            if not isinstance(item, str):
                self.check_token_ids(item, "input")
            prompts.append(await self.tokenize(item, add_special_tokens, truncate_prompt_tokens, param="input"))
        return prompts

    async def _pool(self, prompts: list[TokensPrompt], params: Union[PoolingParams, list[PoolingParams]],
                    request_id: str, raw_request: Request, priority: int) -> list[PoolingRequestOutput]:
        """One request per prompt (`params`: for all of them, or one each)."""
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        streams = [self.engine.encode(prompt, prompt_params, f"{request_id}-{i}", priority=priority,
                                      trace_headers=self.trace_headers(raw_request))
                   for i, (prompt, prompt_params) in enumerate(zip(prompts, params_list))]
        finals: dict[int, PoolingRequestOutput] = {}
        async for index, output in self.outputs(merge_async_iterators(*streams), raw_request, len(prompts)):
            finals[index] = output
        return [finals[i] for i in range(len(prompts))]

    async def _scores(self, firsts: list[str], seconds: list[str], request: Union[ScoreRequest, RerankRequest],
                      request_id: str, raw_request: Request) -> tuple[list[float], list[PoolingRequestOutput]]:
        """One score per pair (one first text against each second, or pairwise): a cross-encoder's output on
        the pair, else the cosine similarity of the two embeddings."""
        if len(firsts) == 1:
            firsts = firsts * len(seconds)
        if len(firsts) != len(seconds) or not seconds:
            raise APIError(f"Score takes one text_1 against N text_2 or N against N, got {len(firsts)} and "
                           f"{len(seconds)}.", param="text_2")
        if self.cross_encoder:
            return await self._cross_encode(firsts, seconds, request, request_id, raw_request)
        if request.activation is not None:
            raise APIError("activation applies to a cross-encoder's scores; this model scores by the cosine "
                           "similarity of embeddings.", param="activation")
        prompts = await self._prompts(firsts + seconds, True, request.truncate_prompt_tokens)
        outputs = await self._pool(prompts, PoolingParams(task="embed"), request_id, raw_request, request.priority)
        n = len(firsts)
        vectors = torch.stack([o.outputs.data for o in outputs])
        scores = torch.nn.functional.cosine_similarity(vectors[:n], vectors[n:], dim=1)
        return scores.tolist(), outputs


    async def _cross_encode(self, firsts: list[str], seconds: list[str], request: Union[ScoreRequest, RerankRequest],
                            request_id: str, raw_request: Request
                            ) -> tuple[list[float], list[PoolingRequestOutput]]:
        """Each pair through the cross-encoder in one pass."""
        base = PoolingParams(activation=request.activation, truncate_prompt_tokens=request.truncate_prompt_tokens)
        pairs = []
        for text_1, text_2 in zip(firsts, seconds):
            if not text_1 or not text_2:
                raise APIError("Score inputs must not be empty texts.", param="text_1" if not text_1 else "text_2")
            pairs.append(await self._off_loop(pair_request, self.tokenizer, text_1, text_2, self.model_config, base))
        outputs = await self._pool([prompt for prompt, _ in pairs], [params for _, params in pairs], request_id,
                                   raw_request, request.priority)
        return [float(o.outputs.data.reshape(-1)[0]) for o in outputs], outputs


def _encode(data: torch.Tensor, encoding_format: str) -> Union[list, str]:
    """float: (nested) lists; base64: the float32 values' little-endian bytes, as OpenAI's client reads them."""
    if encoding_format == "float":
        return data.tolist()
    return base64.b64encode(data.to(torch.float32).contiguous().numpy().astype("<f4").tobytes()).decode()


def _usage(outputs: list[PoolingRequestOutput]) -> PoolingUsage:
    tokens = sum(len(o.prompt_token_ids) for o in outputs)
    return PoolingUsage(prompt_tokens=tokens, total_tokens=tokens)


def _json(response: Any) -> Response:
    return JSONResponse(response.model_dump())
