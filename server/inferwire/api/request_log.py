"""One access line per RPC; for an inference request, one record with its status code.

Every RPC gets exactly one line. Infer and InferStream write theirs here, from
`logged_request` (logger `inferwire.requests`), where the request's tokens and status
code are known: the code the error table gives its error, OK, CANCELLED, or
DEADLINE_EXCEEDED when the caller's deadline had passed by the time it went away.
Every other RPC, and an inference RPC refused before it reached the servicer (no
token, undecodable), gets its line from the metrics interceptor (`inferwire.access`),
through `write_access_line`.

Prompt and output text are logged only when `server.log_prompts` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from inferwire.api.status import MAX_FIELD_BYTES, bounded, status_code_for
from inferwire.core.types import InferenceRequest, RequestAccount

request_log = logging.getLogger("inferwire.requests")
access_log = logging.getLogger("inferwire.access")


@dataclass
class RpcCall:
    """The RPC being served, as the metrics interceptor saw it arrive."""

    method: str
    peer: str
    logged: bool = False  # its access line was written


_CALL: contextvars.ContextVar[RpcCall | None] = contextvars.ContextVar(
    "inferwire_rpc_call", default=None
)


def begin_call(method: str, peer: str) -> RpcCall:
    """Note the RPC this task serves; every RPC runs in its own task."""
    call = RpcCall(method, peer)
    _CALL.set(call)
    return call


def write_access_line(
    logger: logging.Logger, message: str, call: RpcCall, fields: dict[str, Any]
) -> None:
    """Write the RPC's one access line: the common fields, then `fields`."""
    call.logged = True
    if not logger.isEnabledFor(logging.INFO):
        return
    # `logger.info` less its search of the stack for the caller, which costs about as much
    # as formatting the line: the record names this function as where it was made.
    record = logger.makeRecord(
        logger.name,
        logging.INFO,
        __file__,
        sys._getframe().f_lineno,
        message,
        (),
        None,
        write_access_line.__name__,
        {"method": call.method, "peer": call.peer, **fields},
    )
    logger.handle(record)


@contextlib.contextmanager
def logged_request(
    request: InferenceRequest,
    principal: str = "anonymous",
    output: list[str] | None = None,
    log_prompts: bool = False,
) -> Iterator[RequestAccount]:
    """Yield the account the core fills for `request`; write its record when it ends.

    `principal` is who called: a token's name, never the token. With `log_prompts`,
    the record carries the prompt and the text in `output`, which the caller fills.
    """
    account = RequestAccount(request_id=request.request_id, model=request.model)
    call = _CALL.get() or RpcCall(method="", peer="")
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
        elapsed_ms = round((time.perf_counter() - started) * 1e3, 3)
        texts = {"prompt": request.prompt, "text": "".join(output or ())} if log_prompts else {}
        write_access_line(
            request_log,
            "request finished",
            call,
            {
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
                "duration_ms": elapsed_ms,
                "total_ms": elapsed_ms,
                **texts,
            },
        )
