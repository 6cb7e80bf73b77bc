"""OpenAI's error JSON, and the exceptions the handlers turn into it."""
from __future__ import annotations

import re
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
    HTTPStatus.GATEWAY_TIMEOUT: "TimeoutError",
}
# Libraries put source locations into their messages ("[10:28:10] /project/cpp/parser.cc:820: ..."); the
# client needs the message, not where in the server it was raised.
_SOURCE_LOCATION = re.compile(r"\[\d\d:\d\d:\d\d\] |(?:[\w.\-]*/)+[\w.\-]+\.(?:py|pyx|cc|cpp|c|h|hpp|so)(?::\d+)*:? ?")
_MODULE_PREFIX = re.compile(r"\b(?:[a-z_]\w*\.){2,}(?=[A-Z])")  # "pkg.module.Class.f()" -> "Class.f()"


class APIError(Exception):
    """A request the server refuses with a given status (the message is shown to the client)."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST,
                 param: Optional[str] = None, headers: Optional[dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.headers = headers


class ClientDisconnected(Exception):
    """The client closed the connection; its requests have been aborted."""


def public_message(message: str) -> str:
    """`message` without the source paths and module names of the server's code."""
    return _MODULE_PREFIX.sub("", _SOURCE_LOCATION.sub("", message))


def error_body(message: str, status: HTTPStatus, param: Optional[str] = None) -> ErrorResponse:
    kind = _ERROR_TYPES.get(status, status.phrase.replace(" ", "") + "Error")
    return ErrorResponse(error=ErrorInfo(message=public_message(message), type=kind, param=param, code=int(status)))


def error_response(message: str, status: HTTPStatus, param: Optional[str] = None,
                   headers: Optional[dict[str, str]] = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param).model_dump(), status_code=int(status), headers=headers)
