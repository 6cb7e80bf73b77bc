"""The server's LoRA adapters, by the model name requests give: those of `--lora-modules` and, where
VLLM_ALLOW_RUNTIME_LORA_UPDATING (or PAGEDLLM_ALLOW_RUNTIME_LORA_UPDATING) is true, those loaded and unloaded
at run time through POST /v1/load_lora_adapter and /v1/unload_lora_adapter."""
from __future__ import annotations

import itertools
import os
from http import HTTPStatus
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

from pagedllm.entrypoints.openai.errors import APIError
from pagedllm.entrypoints.openai.protocol import OpenAIBaseModel
from pagedllm.lora.request import LoRARequest


class LoadLoRAAdapterRequest(OpenAIBaseModel):
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(OpenAIBaseModel):
    lora_name: str
    lora_int_id: Optional[int] = None


def runtime_updates_allowed() -> bool:
    value = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING") or os.environ.get("PAGEDLLM_ALLOW_RUNTIME_LORA_UPDATING")
    return (value or "").strip().lower() in ("1", "true")


class LoRAModules:
    """Adapters by name, each registered with every worker (add_lora) before requests may name it."""

    def __init__(self, engine: Any, base_model_name: str) -> None:
        self.engine, self.base_model_name = engine, base_model_name
        self.adapters: dict[str, LoRARequest] = {}
        self._ids = itertools.count(1)

    def get(self, name: Optional[str]) -> Optional[LoRARequest]:
        return self.adapters.get(name) if name is not None else None

    async def load(self, name: str, path: str, base_model_name: Optional[str] = None) -> LoRARequest:
        """Register an adapter; a bad one raises the engine's ValueError or RuntimeError."""
        if name in self.adapters:
            raise APIError(f"The lora adapter '{name}' has already been loaded.", HTTPStatus.BAD_REQUEST,
                           param="lora_name")
        request = LoRARequest(name, next(self._ids), path, base_model_name=base_model_name or self.base_model_name)
        await self.engine.add_lora(request)
        self.adapters[name] = request
        return request

    async def unload(self, name: str) -> None:
        request = self.adapters.pop(name, None)
        if request is None:
            raise APIError(f"The lora adapter '{name}' cannot be found.", HTTPStatus.NOT_FOUND, param="lora_name")
        await self.engine.remove_lora(request.lora_int_id)


def add_lora_routes(app: FastAPI) -> None:
    """The runtime loading routes, only where runtime updates are allowed."""
    if not runtime_updates_allowed():
        return

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: LoadLoRAAdapterRequest, raw_request: Request) -> Response:
        try:
            await raw_request.app.state.lora_modules.load(request.lora_name, request.lora_path)
        except (ValueError, RuntimeError) as error:  # the engine's refusal
            raise APIError(str(error), HTTPStatus.BAD_REQUEST, param="lora_path") from None
        return PlainTextResponse(f"Success: LoRA adapter '{request.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: UnloadLoRAAdapterRequest, raw_request: Request) -> Response:
        await raw_request.app.state.lora_modules.unload(request.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{request.lora_name}' removed successfully.")
