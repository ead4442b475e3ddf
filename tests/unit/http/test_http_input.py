"""What the HTTP door refuses before a request reaches the core, as tests/engine/
test_http_fuzz.py found it must: JSON strings holding a lone surrogate (http/bodies.py),
request ids that the `x-request-id` header cannot carry (http/requests.py), and paths,
methods and errors that escaped a handler, all with OpenAI's error body (http/routes.py)."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import Route
from starlette.testclient import TestClient

from inferwire.core.errors import InvalidArgumentError
from inferwire.edge.errors import MalformedRequestError, error_reply
from inferwire.http import routes
from inferwire.http.bodies import decode_json
from inferwire.http.errors import http_answer
from inferwire.http.requests import parse


@pytest.mark.parametrize(
    ("text", "param"),
    [
        ('{"model": "demo", "prompt": "\\ud800"}', "prompt"),
        ('{"messages": [{"role": "user", "content": "x\\uDFFF"}]}', "messages[0].content"),
        ('{"model": "demo", "\\ud800": 1}', "body"),
        ('[["ok", "\\udc00"]]', "body[0][1]"),
        ('"\\ud83d"', "body"),
    ],
)
def test_a_lone_surrogate_is_400_naming_where_it_is(text, param):
    with pytest.raises(MalformedRequestError) as raised:
        decode_json(text.encode())
    status, body, _ = http_answer(error_reply(raised.value))
    assert (status, body["error"]["param"]) == (400, param)
    assert "lone surrogate" in body["error"]["message"]


def test_surrogate_pairs_and_escaped_backslashes_are_text():
    text = b'{"a": "\\ud83d\\ude42", "b": "\\\\ud800", "c": "\\u00e9"}'
    assert decode_json(text) == {"a": "\U0001f642", "b": "\\ud800", "c": "\u00e9"}


def test_a_deep_body_is_searched_without_recursion():
    depth = 500
    text = "[" * depth + '"\\ud800"' + "]" * depth
    with pytest.raises(MalformedRequestError) as raised:
        decode_json(text.encode())
    assert raised.value.field == "body" + "[0]" * depth


@pytest.mark.parametrize("request_id", ["a\nb", "a\rb", "\u6f22\u5b57", "tab\tid", "\x7f", "\xe9"])
def test_a_request_id_no_header_can_carry_is_refused(request_id):
    body = {"model": "demo", "prompt": "x", "request_id": request_id}
    with pytest.raises(InvalidArgumentError) as raised:
        parse(body, chat=False, tenant="t", request_id=None)
    assert [v.field for v in raised.value.violations] == ["request_id"]


def test_a_printable_request_id_is_taken():
    body = {"model": "demo", "prompt": "x", "request_id": "req-1 (retry 2)"}
    parsed = parse(body, chat=False, tenant="t", request_id=None)
    assert parsed.inference.request_id == "req-1 (retry 2)"


async def _broken(request: Request) -> None:
    raise RuntimeError("a bug")


def test_no_route_a_wrong_method_and_an_escaped_error_get_openai_s_error_body():
    handlers = {HTTPException: routes._no_such_route, Exception: routes._escaped}
    app = Starlette(routes=[Route("/broken", _broken)], exception_handlers=handlers)
    client = TestClient(app, raise_server_exceptions=False)
    replies = [client.get("/nowhere"), client.post("/broken"), client.get("/broken")]
    assert [r.status_code for r in replies] == [404, 405, 500]
    codes = [r.json()["error"]["code"] for r in replies]
    assert codes == ["not_found", "unimplemented", "internal"]
    assert set(replies[1].headers["allow"].split(", ")) == {"GET", "HEAD"}
    assert "a bug" not in replies[2].text
