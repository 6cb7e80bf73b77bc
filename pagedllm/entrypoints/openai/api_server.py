"""The FastAPI app of the OpenAI-compatible server, and running it under uvicorn."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import secrets
from http import HTTPStatus
from typing import Any, Optional

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pagedllm import __version__
from pagedllm.config import AsyncEngineArgs
from pagedllm.engine.async_engine import AsyncEngineDeadError, AsyncLLMEngine
from pagedllm.entrypoints.openai.errors import APIError, ClientDisconnected, error_response
from pagedllm.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                                  ModelCard, ModelList, TokenizeRequest)
from pagedllm.entrypoints.openai.serving_chat import OpenAIServingChat
from pagedllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from pagedllm.entrypoints.openai.serving_tokenization import OpenAIServingTokenization

logger = logging.getLogger(__name__)


class GuardMiddleware:
    """Checks the API key on /v1 routes and caps the request body size, before any route runs."""

    def __init__(self, app: ASGIApp, api_key: Optional[str], max_body_bytes: int) -> None:
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path = scope["path"]
        root = scope.get("root_path") or ""
        if root and path.startswith(root):
            path = path[len(root):]
        if self.api_key and path.startswith("/v1") and scope["method"] != "OPTIONS":
            given = headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                response = error_response("Invalid or missing API key.", HTTPStatus.UNAUTHORIZED)
                return await response(scope, receive, send)
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            response = error_response(f"The request body exceeds {self.max_body_bytes} bytes.",
                                      HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
            return await response(scope, receive, send)
        await self.app(scope, self._capped(receive), send)

    def _capped(self, receive: Receive) -> Receive:
        received = 0

        async def capped_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:  # a body sent without Content-Length
                raise HTTPException(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                    f"The request body exceeds {self.max_body_bytes} bytes.")
            return message

        return capped_receive


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, error: APIError) -> Response:
        return error_response(str(error), error.status, error.param)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, error: RequestValidationError) -> Response:
        details = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors())
        return error_response(details or "Invalid request body.", HTTPStatus.BAD_REQUEST)

    @app.exception_handler(ValueError)
    @app.exception_handler(TypeError)
    async def bad_value(_: Request, error: Exception) -> Response:
        return error_response(str(error), HTTPStatus.BAD_REQUEST)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException) -> Response:
        return error_response(str(error.detail), HTTPStatus(error.status_code))

    @app.exception_handler(AsyncEngineDeadError)
    async def engine_dead(_: Request, error: AsyncEngineDeadError) -> Response:
        return error_response(str(error), HTTPStatus.SERVICE_UNAVAILABLE)

    @app.exception_handler(ClientDisconnected)
    async def client_gone(_: Request, __: ClientDisconnected) -> Response:
        return Response(status_code=499)  # nobody is listening; the status is for access logs


def _add_routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health(raw_request: Request) -> Response:
        await raw_request.app.state.engine.check_health()
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get("/v1/models")
    async def models(raw_request: Request) -> dict[str, Any]:
        state = raw_request.app.state
        cards = [ModelCard(id=name, root=state.model_path, max_model_len=state.completion.max_model_len)
                 for name in state.completion.served_model_names]
        return ModelList(data=cards).model_dump()

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest, raw_request: Request) -> Response:
        return await raw_request.app.state.completion.create_completion(request, raw_request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest, raw_request: Request) -> Response:
        return await raw_request.app.state.chat.create_chat_completion(request, raw_request)

    @app.post("/tokenize")
    async def tokenize(request: TokenizeRequest, raw_request: Request) -> Response:
        return JSONResponse(raw_request.app.state.tokenization.create_tokenize(request).model_dump())

    @app.post("/detokenize")
    async def detokenize(request: DetokenizeRequest, raw_request: Request) -> Response:
        return JSONResponse(raw_request.app.state.tokenization.create_detokenize(request).model_dump())


def _mount_metrics(app: FastAPI) -> None:
    from prometheus_client import make_asgi_app

    route = Mount("/metrics", make_asgi_app())
    # Serve /metrics itself rather than redirecting it to /metrics/.
    route.path_regex = re.compile(r"^/metrics(?P<path>.*)$")
    app.routes.append(route)


async def build_app(engine: AsyncLLMEngine, args: argparse.Namespace) -> FastAPI:
    """The app over a started engine; `args` holds the server flags (add_server_args)."""
    app = FastAPI(root_path=args.root_path or "")
    api_key = args.api_key or os.environ.get("VLLM_API_KEY") or os.environ.get("PAGEDLLM_API_KEY")
    app.add_middleware(GuardMiddleware, api_key=api_key, max_body_bytes=args.max_request_body_bytes)
    _add_error_handlers(app)
    _add_routes(app)
    _mount_metrics(app)
    model_config = await engine.get_model_config()
    shared = dict(engine=engine, served_model_names=[model_config.served_model_name],
                  tokenizer=await engine.get_tokenizer(), max_model_len=model_config.max_model_len,
                  default_params=await engine.get_default_sampling_params(), chat_template=args.chat_template)
    app.state.engine = engine
    app.state.model_path = model_config.path
    app.state.completion = OpenAIServingCompletion(**shared)
    app.state.chat = OpenAIServingChat(**shared)
    app.state.tokenization = OpenAIServingTokenization(**shared)
    return app


async def serve(args: argparse.Namespace) -> None:
    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs.from_cli_args(args))
    app = await build_app(engine, args)
    config = uvicorn.Config(app, host=args.host, port=args.port, root_path=args.root_path or "",
                            log_level=args.uvicorn_log_level)
    try:
        await uvicorn.Server(config).serve()
    finally:
        engine.shutdown_background_loop()


def run_server(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(name)s: %(message)s")
    asyncio.run(serve(args))
