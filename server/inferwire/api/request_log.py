"""One log record per inference request, however it ended, with its status code.

The core fills a RequestAccount (tokens, outcome, queue time) as the request runs; the
record is written here, where the request's status code is known: the code the error
table gives its error, OK, CANCELLED, or DEADLINE_EXCEEDED when the caller's deadline
had passed by the time it went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator

import grpc

from inferwire.api.status import MAX_FIELD_BYTES, bounded, status_code_for
from inferwire.core.types import InferenceRequest, RequestAccount

request_log = logging.getLogger("inferwire.requests")


@contextlib.contextmanager
def logged_request(
    request: InferenceRequest, principal: str = "anonymous"
) -> Iterator[RequestAccount]:
    """Yield the account the core fills for `request`; write its record when it ends.

    `principal` is who called: a token's name, never the token.
    """
    account = RequestAccount(request_id=request.request_id, model=request.model)
    started = time.perf_counter()
    code = grpc.StatusCode.OK
    try:
        yield account
    except (asyncio.CancelledError, GeneratorExit):
        deadline_passed = request.deadline is not None and time.monotonic() >= request.deadline
        code = grpc.StatusCode.DEADLINE_EXCEEDED if deadline_passed else grpc.StatusCode.CANCELLED
        account.outcome = "deadline_exceeded" if deadline_passed else "cancelled"
        raise
    except Exception as error:
        code = status_code_for(error)
        raise
    finally:
        request_log.info(
            "request finished",
            extra={
                "request_id": bounded(account.request_id, MAX_FIELD_BYTES),
                "model": bounded(account.model, MAX_FIELD_BYTES),
                "code": code.name,
                "principal": principal,
                "outcome": account.outcome,
                "prompt_tokens": account.prompt_tokens,
                "completion_tokens": account.completion_tokens,
                "cancelled": code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED),
                "tokens_after_cancel": account.tokens_after_cancel,
                "queue_ms": round(account.queue_ms, 3),
                "total_ms": round((time.perf_counter() - started) * 1e3, 3),
            },
        )
