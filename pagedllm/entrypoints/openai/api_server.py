"""The FastAPI app of the OpenAI-compatible server, and running it under uvicorn.

By default the engine runs in its own process (MQLLMEngineClient); this process parses, validates, tokenizes
and renders chat templates. `--disable-frontend-multiprocessing` keeps the engine here (AsyncLLMEngine).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import Any, AsyncIterator, Awaitable, Optional

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from pagedllm import __version__
from pagedllm.config import AsyncEngineArgs
from pagedllm.engine.async_engine import (AsyncEngineDeadError, AsyncLLMEngine, RequestFailedError,
                                          RequestParametersError)
from pagedllm.engine.sleep_mode import SLEEP_TAGS, EngineSleepingError, SleepRefusedError
from pagedllm.entrypoints.openai.errors import APIError, ClientDisconnected, error_response
from pagedllm.entrypoints.openai.guard import GuardMiddleware
from pagedllm.entrypoints.openai.limits import Admission, PromptLimit
from pagedllm.entrypoints.openai.protocol import (ChatCompletionRequest, ChatCompletionResponse, CompletionRequest,
                                                  CompletionResponse, DetokenizeRequest, DetokenizeResponse,
                                                  ErrorResponse, ModelCard, ModelList, TokenizeRequest,
                                                  TokenizeResponse)
from pagedllm.entrypoints.openai.pooling_routes import add_pooling_routes
from pagedllm.entrypoints.openai.serving_chat import OpenAIServingChat
from pagedllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from pagedllm.entrypoints.openai.serving_engine import ServingContext
from pagedllm.entrypoints.openai.serving_lora import LoRAModules, add_lora_routes
from pagedllm.entrypoints.openai.serving_pooling import OpenAIServingPooling
from pagedllm.entrypoints.openai.serving_tokenization import OpenAIServingTokenization

logger = logging.getLogger(__name__)
# One thread: a fast tokenizer sets its truncation state per call and refuses concurrent use ("Already
# borrowed"); the point of the thread is to keep the event loop free.
_TOKENIZER_THREADS = 1


_REQUEST_FIELDS = frozenset(CompletionRequest.model_fields) | frozenset(ChatCompletionRequest.model_fields)


def _field_named(message: str) -> Optional[str]:
    """The request field an engine error starts with ("logit_bias contains ..."), for the error's `param`."""
    first = message.split(" ", 1)[0]
    return first if first in _REQUEST_FIELDS else None


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, error: APIError) -> Response:
        return error_response(str(error), error.status, error.param, error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, error: RequestValidationError) -> Response:
        errors = error.errors()
        fields = [".".join(str(p) for p in e["loc"] if p != "body") for e in errors]
        details = "; ".join(f"{field or 'body'}: {e['msg']}" for field, e in zip(fields, errors))
        return error_response(details or "Invalid request body.", HTTPStatus.BAD_REQUEST,
                              fields[0] if fields and fields[0] else None)

    @app.exception_handler(ValueError)
    @app.exception_handler(TypeError)
    async def bad_value(_: Request, error: Exception) -> Response:
        return error_response(str(error), HTTPStatus.BAD_REQUEST, _field_named(str(error)))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException) -> Response:
        return error_response(str(error.detail), HTTPStatus(error.status_code))

    @app.exception_handler(AsyncEngineDeadError)
    async def engine_dead(_: Request, error: AsyncEngineDeadError) -> Response:
        return error_response(str(error), HTTPStatus.SERVICE_UNAVAILABLE)

    @app.exception_handler(EngineSleepingError)
    async def engine_sleeping(_: Request, error: EngineSleepingError) -> Response:
        return error_response(str(error), HTTPStatus.SERVICE_UNAVAILABLE)

    @app.exception_handler(SleepRefusedError)
    async def sleep_refused(_: Request, error: SleepRefusedError) -> Response:
        return error_response(str(error), HTTPStatus.CONFLICT)

    @app.exception_handler(RequestFailedError)
    async def request_failed(_: Request, error: RequestFailedError) -> Response:
        return error_response(str(error), HTTPStatus.INTERNAL_SERVER_ERROR)  # the engine logged why

    @app.exception_handler(RequestParametersError)
    async def request_unsatisfiable(_: Request, error: RequestParametersError) -> Response:
        return error_response(str(error), HTTPStatus.BAD_REQUEST)

    @app.exception_handler(ClientDisconnected)
    async def client_gone(_: Request, __: ClientDisconnected) -> Response:
        return Response(status_code=499)  # nobody is listening; the status is for access logs

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception) -> Response:
        # Logged here with its traceback; the client gets no internals.
        logger.error("%s %s failed.", request.method, request.url.path, exc_info=error)
        return error_response("The server failed to handle this request.", HTTPStatus.INTERNAL_SERVER_ERROR)


_ERRORS: dict[int | str, dict[str, Any]] = {
    int(status): {"model": ErrorResponse} for status in (
        HTTPStatus.BAD_REQUEST, HTTPStatus.UNAUTHORIZED, HTTPStatus.NOT_FOUND, HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
        HTTPStatus.SERVICE_UNAVAILABLE, HTTPStatus.GATEWAY_TIMEOUT)}


def _documented(model: type, streamed: bool = False) -> dict[int | str, dict[str, Any]]:
    """The responses a route may give, for the OpenAPI schema (200 as `model`, or as server-sent events)."""
    ok: dict[str, Any] = {"model": model}
    if streamed:
        # Each event's `data` is one chunk's JSON, then `[DONE]`.
        event = {"type": "object", "properties": {"data": {"type": "string"}}, "required": ["data"]}
        ok["content"] = {"text/event-stream": {"schema": event}}
    return {200: ok, **_ERRORS}


def _add_routes(app: FastAPI) -> None:
    @app.get("/health", response_class=Response, responses={200: {"description": "The engine is healthy."},
                                                             503: {"model": ErrorResponse}})
    async def health(raw_request: Request) -> Response:
        await raw_request.app.state.engine.check_health()
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get("/v1/models", responses=_documented(ModelList))
    async def models(raw_request: Request) -> Response:
        state = raw_request.app.state
        cards = [ModelCard(id=name, root=state.model_path, max_model_len=state.completion.max_model_len)
                 for name in state.completion.served_model_names]
        cards += [ModelCard(id=lora.lora_name, root=lora.lora_path, parent=lora.base_model_name)
                  for lora in state.lora_modules.adapters.values()]
        return JSONResponse(ModelList(data=cards).model_dump())

    @app.post("/v1/completions", responses=_documented(CompletionResponse, streamed=True))
    async def completions(request: CompletionRequest, raw_request: Request) -> Response:
        raw_request.app.state.pooling.refuse_generation("Completions")
        return await _unless_cut_off(raw_request, raw_request.app.state.completion.create_completion(
            request, raw_request))

    @app.post("/v1/chat/completions", responses=_documented(ChatCompletionResponse, streamed=True))
    async def chat_completions(request: ChatCompletionRequest, raw_request: Request) -> Response:
        raw_request.app.state.pooling.refuse_generation("Chat Completions")
        return await _unless_cut_off(raw_request, raw_request.app.state.chat.create_chat_completion(
            request, raw_request))

    @app.post("/tokenize", responses=_documented(TokenizeResponse))
    async def tokenize(request: TokenizeRequest, raw_request: Request) -> Response:
        return JSONResponse((await raw_request.app.state.tokenization.create_tokenize(request)).model_dump())

    @app.post("/detokenize", responses=_documented(DetokenizeResponse))
    async def detokenize(request: DetokenizeRequest, raw_request: Request) -> Response:
        return JSONResponse((await raw_request.app.state.tokenization.create_detokenize(request)).model_dump())

    @app.get("/metrics", include_in_schema=False)
    async def metrics(raw_request: Request) -> Response:
        """The engine's metrics: asked of the engine process, or read from this process's registry."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        engine = raw_request.app.state.engine
        text = await engine.metrics_text() if hasattr(engine, "metrics_text") else generate_latest()
        return Response(text, media_type=CONTENT_TYPE_LATEST)


def _add_dev_routes(app: FastAPI) -> None:
    """Sleep mode over HTTP, as vLLM offers it only with VLLM_SERVER_DEV_MODE=1 (not in the schema)."""
    @app.post("/sleep", include_in_schema=False)
    async def sleep(raw_request: Request) -> Response:
        level = raw_request.query_params.get("level", "1")
        if level not in ("1", "2"):
            raise APIError(f"level must be 1 or 2, got {level!r}.", param="level")
        await raw_request.app.state.engine.sleep(int(level))  # SleepRefusedError (409) with requests in flight
        return Response(status_code=200)

    @app.post("/wake_up", include_in_schema=False)
    async def wake_up(raw_request: Request) -> Response:
        tags = raw_request.query_params.getlist("tags")
        unknown = sorted(set(tags) - set(SLEEP_TAGS))
        if unknown:
            raise APIError(f"Unknown tags {unknown}; valid tags are {list(SLEEP_TAGS)}.", param="tags")
        await raw_request.app.state.engine.wake_up(tags or None)
        return Response(status_code=200)

    @app.get("/is_sleeping", include_in_schema=False)
    async def is_sleeping(raw_request: Request) -> Response:
        return JSONResponse({"is_sleeping": await raw_request.app.state.engine.is_sleeping()})


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    # The engine stops here, inside uvicorn's shutdown: uvicorn re-raises SIGTERM once it returns, which
    # would end this process before any code after it ran.
    yield
    app.state.engine.shutdown()
    logger.info("The engine has shut down.")


async def _unless_cut_off(raw_request: Request, handler: Awaitable[Response]) -> Response:
    """The handler's response; a 503 if the shutdown's grace period ends before it (the engine requests are
    aborted as the handler is cancelled)."""
    try:
        return await handler
    except asyncio.CancelledError:
        if not raw_request.app.state.draining:
            raise
        return error_response("The server shut down before this request finished.", HTTPStatus.SERVICE_UNAVAILABLE)


class _Server(uvicorn.Server):
    """uvicorn's server, marking the app as draining when a shutdown signal arrives."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.app = app

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.app.state.draining = True
        logger.info("Shutting down: requests in flight have %s s to finish.", self.config.timeout_graceful_shutdown)
        super().handle_exit(sig, frame)


async def build_app(engine: Any, args: argparse.Namespace) -> FastAPI:
    """The app over a started engine (AsyncLLMEngine or MQLLMEngineClient); `args` holds the server flags
    (add_server_args). Under uvicorn, the app shuts the engine down when the server stops."""
    app = FastAPI(root_path=args.root_path or "", title="pagedllm", version=__version__, lifespan=_lifespan)
    api_key = args.api_key or os.environ.get("VLLM_API_KEY") or os.environ.get("PAGEDLLM_API_KEY")
    app.add_middleware(GuardMiddleware, api_key=api_key, max_body_bytes=args.max_request_body_bytes)
    _add_error_handlers(app)
    _add_routes(app)
    add_lora_routes(app)
    add_pooling_routes(app, _documented)
    if (os.environ.get("VLLM_SERVER_DEV_MODE") or os.environ.get("PAGEDLLM_SERVER_DEV_MODE")) == "1":
        _add_dev_routes(app)
    app.state.engine = engine
    app.state.draining = False
    app.state.model_path = (await engine.get_model_config()).path
    app.state.lora_modules = await _lora_modules(engine, args)
    context = await _serving_context(engine, args, app.state.lora_modules)
    app.state.completion = OpenAIServingCompletion(context)
    app.state.chat = OpenAIServingChat(context)
    app.state.tokenization = OpenAIServingTokenization(context)
    app.state.pooling = OpenAIServingPooling(context, await engine.get_model_config())
    return app


async def _lora_modules(engine: Any, args: argparse.Namespace) -> LoRAModules:
    """The adapters of --lora-modules, registered with the engine (a bad one stops the server's start)."""
    modules = LoRAModules(engine, (await engine.get_model_config()).served_model_name)
    for module in getattr(args, "lora_modules", None) or []:
        await modules.load(module.lora_name, module.lora_path, module.base_model_name)
    return modules


async def _serving_context(engine: Any, args: argparse.Namespace, lora_modules: LoRAModules) -> ServingContext:
    model_config = await engine.get_model_config()
    tokenizer = await engine.get_tokenizer()
    max_num_seqs = (await engine.get_scheduler_config()).max_num_seqs
    waiting = args.max_waiting_requests
    return ServingContext(
        engine=engine, served_model_names=[model_config.served_model_name], tokenizer=tokenizer,
        max_model_len=model_config.max_model_len, vocab_size=model_config.vocab_size,
        default_params=await engine.get_default_sampling_params(), chat_template=args.chat_template,
        admission=Admission(None if waiting < 0 else max_num_seqs + waiting),
        prompt_limit=PromptLimit.for_tokenizer(tokenizer, model_config.max_model_len),
        request_timeout=args.request_timeout, trust_request_chat_template=args.trust_request_chat_template,
        pool=ThreadPoolExecutor(max_workers=_TOKENIZER_THREADS, thread_name_prefix="pagedllm-tokenize"),
        lora_modules=lora_modules)


async def _start_engine(args: argparse.Namespace) -> Any:
    engine_args = AsyncEngineArgs.from_cli_args(args)
    if args.disable_frontend_multiprocessing:
        return AsyncLLMEngine.from_engine_args(engine_args)
    from pagedllm.engine.multiprocessing.client import MQLLMEngineClient

    return await MQLLMEngineClient.start(engine_args)


async def serve(args: argparse.Namespace) -> None:
    engine = await _start_engine(args)
    try:
        app = await build_app(engine, args)
        # On SIGTERM uvicorn stops accepting, lets requests in flight finish for the grace period, then
        # cancels them (which aborts their engine requests); the engine stops after that.
        config = uvicorn.Config(app, host=args.host, port=args.port, root_path=args.root_path or "",
                                log_level=args.uvicorn_log_level, timeout_graceful_shutdown=args.shutdown_timeout)
        await _Server(config, app).serve()
    finally:
        engine.shutdown()  # when the app never started; a second call does nothing


def run_server(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(name)s: %(message)s")
    asyncio.run(serve(args))
