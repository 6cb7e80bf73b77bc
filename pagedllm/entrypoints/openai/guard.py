"""The checks every HTTP request passes before any route runs: the API key on /v1, and the body size."""
from __future__ import annotations

import secrets
from http import HTTPStatus
from typing import Optional

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pagedllm.entrypoints.openai.errors import error_response


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
