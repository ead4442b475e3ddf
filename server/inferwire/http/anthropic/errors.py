"""An error as Anthropic's error body, with its HTTP status: the edge's one table, Anthropic's
words.

The code and the reply come from the edge (edge/errors.py `CODE_BY_ERROR`, the call's
`error_reply`), the status from the same mapping as OpenAI's body (http/errors.py), with
one difference Anthropic's clients act on: a server too busy to take the request (a full
queue, memory that cannot be freed: RESOURCE_EXHAUSTED that is no tenant's quota) is 529
`overloaded_error`, which Anthropic's SDKs retry, while a tenant's quota is 429
`rate_limit_error`; both carry `retry-after` when the edge knows when. The body is
`{"type": "error", "error": {"type", "message"}}`; the message names the field at fault
(`max_tokens: Field required`), as Anthropic's do; a refusal of the body itself says
where (`the body is not text: messages[0].content holds ...`). An error after a stream's
first event is an `error` event with the same body.
"""

from __future__ import annotations

import json
from typing import Any

from inferwire.edge.errors import Code, ErrorReply
from inferwire.http.errors import HTTP_STATUS, http_answer

OVERLOADED = 529  # Anthropic's status for "try again shortly"
# Anthropic's error `type` of each status (its SDKs pick their exception by the status).
_ERROR_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    503: "overloaded_error",  # a model loading or unloading, a backend down: retried
    504: "timeout_error",
    OVERLOADED: "overloaded_error",
}


def anthropic_answer(reply: ErrorReply) -> tuple[int, dict[str, Any], dict[str, str]]:
    """The status, Anthropic's error body and the headers of an error's `reply`."""
    status, _, headers = http_answer(reply)
    if reply.code is Code.RESOURCE_EXHAUSTED and reply.quota is None and status == 429:
        status = OVERLOADED  # the server's load, not the tenant's quota
    return status, error_body(status, reply.message), headers


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = _ERROR_TYPE.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_event(openai_body: dict[str, Any]) -> bytes:
    """The `error` event of a stream that failed after its first event. It is handed the
    body http/streams.py made (OpenAI's, whose `code` is the canonical code's name)."""
    error = openai_body["error"]
    code = Code.__members__.get(str(error["code"]).upper(), Code.INTERNAL)
    data = error_body(HTTP_STATUS[code], str(error["message"]))
    return b"event: error\ndata: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"
