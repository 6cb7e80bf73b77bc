"""The routes of the pooling endpoints, each under vLLM's paths (and its /v1/ twin)."""
from __future__ import annotations

from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import Response

from pagedllm.entrypoints.openai.protocol_pooling import (ClassificationRequest, ClassificationResponse,
                                                          EmbeddingRequest, EmbeddingResponse, PoolingRequest,
                                                          PoolingResponse, RerankRequest, RerankResponse,
                                                          ScoreRequest, ScoreResponse)


def add_pooling_routes(app: FastAPI, documented: Callable[[type], dict]) -> None:
    """`documented(model)`: the responses a route may give, for the OpenAPI schema."""

    def handler(request_type: type, method: str) -> Any:
        async def route(request: Any, raw_request: Request) -> Response:
            return await getattr(raw_request.app.state.pooling, method)(request, raw_request)
        # FastAPI reads the body's model from the annotation, which must be the class itself, not a string.
        route.__annotations__ = {"request": request_type, "raw_request": Request, "return": Response}
        return route

    endpoints = [
        (("/v1/embeddings",), EmbeddingRequest, EmbeddingResponse, "create_embedding"),
        (("/pooling", "/v1/pooling"), PoolingRequest, PoolingResponse, "create_pooling"),
        (("/classify", "/v1/classify"), ClassificationRequest, ClassificationResponse, "create_classify"),
        (("/score", "/v1/score"), ScoreRequest, ScoreResponse, "create_score"),
        (("/rerank", "/v1/rerank", "/v2/rerank"), RerankRequest, RerankResponse, "create_rerank"),
    ]
    for paths, request_type, response_type, method in endpoints:
        for path in paths:
            app.post(path, responses=documented(response_type))(handler(request_type, method))
