"""Server-sent events: `data: <json>` per chunk, an error event if the request fails midway, then [DONE]."""
from __future__ import annotations

import logging
from http import HTTPStatus
from typing import AsyncIterator, Callable, Optional, TypeVar

from pydantic import BaseModel

from pagedllm.engine.async_engine import AsyncEngineDeadError, RequestFailedError, RequestParametersError
from pagedllm.entrypoints.openai.errors import APIError, ClientDisconnected, error_body
from pagedllm.outputs import Logprob

logger = logging.getLogger(__name__)
T = TypeVar("T")


async def start_stream(items: AsyncIterator[T]) -> AsyncIterator[T]:
    """Wait for the first item before answering, so that a request the engine rejects is still a 400."""
    first = await items.__anext__()

    async def chained() -> AsyncIterator[T]:
        yield first
        async for item in items:
            yield item

    return chained()


async def event_stream(items: AsyncIterator[T],
                       to_chunks: Callable[[AsyncIterator[T]], AsyncIterator[BaseModel]]) -> AsyncIterator[str]:
    try:
        async for chunk in to_chunks(items):
            yield f"data: {chunk.model_dump_json()}\n\n"
    except ClientDisconnected:
        return
    except (APIError, ValueError, TypeError) as error:
        status = error.status if isinstance(error, APIError) else HTTPStatus.BAD_REQUEST
        yield f"data: {error_body(str(error), status).model_dump_json()}\n\n"
    except AsyncEngineDeadError as error:
        yield f"data: {error_body(str(error), HTTPStatus.SERVICE_UNAVAILABLE).model_dump_json()}\n\n"
    except RequestFailedError as error:  # the engine logged why; the others go on
        status = HTTPStatus.BAD_REQUEST if isinstance(error, RequestParametersError) else \
            HTTPStatus.INTERNAL_SERVER_ERROR
        yield f"data: {error_body(str(error), status).model_dump_json()}\n\n"
    except Exception as error:
        logger.exception("Streaming a response failed.")
        yield f"data: {error_body(str(error), HTTPStatus.INTERNAL_SERVER_ERROR).model_dump_json()}\n\n"
    yield "data: [DONE]\n\n"


def prompt_logprobs_json(prompt_logprobs: list[Optional[dict[int, Logprob]]]) -> list[Optional[dict]]:
    return [None if step is None else
            {token_id: {"logprob": max(lp.logprob, -9999.0), "rank": lp.rank, "decoded_token": lp.decoded_token}
             for token_id, lp in step.items()}
            for step in prompt_logprobs]
