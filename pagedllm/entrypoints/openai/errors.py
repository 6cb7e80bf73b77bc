"""OpenAI's error JSON, and the exceptions the handlers turn into it."""
from __future__ import annotations

from http import HTTPStatus
from typing import Optional

from fastapi.responses import JSONResponse

from pagedllm.entrypoints.openai.protocol import ErrorInfo, ErrorResponse

_ERROR_TYPES = {
    HTTPStatus.BAD_REQUEST: "BadRequestError",
    HTTPStatus.UNAUTHORIZED: "AuthenticationError",
    HTTPStatus.NOT_FOUND: "NotFoundError",
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: "RequestTooLargeError",
    HTTPStatus.INTERNAL_SERVER_ERROR: "InternalServerError",
    HTTPStatus.SERVICE_UNAVAILABLE: "ServiceUnavailableError",
}


class APIError(Exception):
    """A request the server refuses with a given status (the message is shown to the client)."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST,
                 param: Optional[str] = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


class ClientDisconnected(Exception):
    """The client closed the connection; its requests have been aborted."""


def error_body(message: str, status: HTTPStatus, param: Optional[str] = None) -> ErrorResponse:
    kind = _ERROR_TYPES.get(status, status.phrase.replace(" ", "") + "Error")
    return ErrorResponse(error=ErrorInfo(message=message, type=kind, param=param, code=int(status)))


def error_response(message: str, status: HTTPStatus, param: Optional[str] = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param).model_dump(), status_code=int(status))
