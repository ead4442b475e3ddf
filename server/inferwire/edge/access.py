"""The access line: one per call, whatever the transport (logger `inferwire.access`).

A call's line names its method, peer, status code and principal; an inference request's
line adds what its record (core/record.py) says: the outcome, the tokens, the queue
time, and with `server.log_prompts` the prompt and the text. A refused call, which the
core never saw, names the request id and model its transport read off the request.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from inferwire.core.auth import Principal
from inferwire.core.record import RequestRecord
from inferwire.edge.errors import MAX_FIELD_BYTES, bounded

access_log = logging.getLogger("inferwire.access")


def access_logged() -> bool:
    """Whether access lines are written (the level lets INFO through)."""
    return access_log.isEnabledFor(logging.INFO)


def write_access_line(
    method: str,
    peer: str,
    code: str,
    principal: Principal,
    record: RequestRecord | None,
    elapsed_s: float,
    *,
    inference: bool,
    request_id: str = "",
    model: str = "",
    trace_id: str = "",
    status: int | None = None,
) -> None:
    """Write one call's line. `code`: the canonical code's name (edge/errors.py Code);
    `inference`: an inference method (its line says `request finished`); `request_id`,
    `model`: what the transport read off a call the core did not see (no record);
    `status`: the HTTP status, on an HTTP call."""
    if not access_logged():
        return
    fields: dict[str, Any] = {"method": method, "peer": peer, "code": code}
    if status is not None:
        fields["status"] = status
    fields["principal"] = principal.name
    if record is None:
        # Refused before the core saw it (no token, no access to the model, undecodable),
        # or not an inference request at all.
        fields |= {
            "request_id": bounded(request_id, MAX_FIELD_BYTES),
            "model": bounded(model, MAX_FIELD_BYTES),
            "tenant": principal.tenant,
            "prompt_tokens": 0,
            "completion_tokens": 0,
        }
    else:
        fields |= {
            "request_id": bounded(record.request_id, MAX_FIELD_BYTES),
            "model": bounded(record.model, MAX_FIELD_BYTES),
            "tenant": record.tenant,
            "priority": record.priority,
            "outcome": record.outcome.value,
            "prompt_tokens": record.prompt_tokens,
            "completion_tokens": record.completion_tokens,
            "tool_calls": record.tool_calls,
            "cancelled": record.outcome.cancelled,
            "tokens_after_cancel": record.tokens_after_cancel,
            "queue_ms": round(record.queue_s * 1e3, 3),
        }
        if record.text is not None:
            fields |= {"prompt": record.prompt, "text": "".join(record.text)}
    if trace_id:
        fields["trace_id"] = trace_id
    fields["duration_ms"] = round(elapsed_s * 1e3, 3)
    message = "request finished" if inference else "rpc finished"
    # `logger.info` less its search of the stack for the caller, which costs about as much
    # as formatting the line (the record names this function as where it was made), and
    # less `makeRecord`'s check of each field against the record's own attributes: these
    # field names are fixed, and none is one of them.
    line = logging.getLogRecordFactory()(
        access_log.name,
        logging.INFO,
        __file__,
        sys._getframe().f_lineno,
        message,
        (),
        None,
        write_access_line.__name__,
    )
    line.__dict__.update(fields)
    access_log.handle(line)
