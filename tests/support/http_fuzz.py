"""Hypothesis strategies for the HTTP door: JSON values, OpenAI and vLLM request bodies
with wild fields, and raw bodies.

A request body is built as Python values and written by `to_json`, so that it can hold
what `json.dumps` will not write: `Raw` tokens (NaN, Infinity, 1e400, an integer of
5,000 digits) and, escaped as JSON allows, lone surrogates (`"\\ud800"`). Most bodies
are plausible but for one or two wild fields, so that many reach the engine, not only
validation (as tests/support/fuzz.py does for gRPC).
"""

from __future__ import annotations

import json
import operator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st


@dataclass(frozen=True)
class Raw:
    """A JSON token written as it is: NaN, Infinity, 1e400 or any other text."""

    text: str


def to_json(value: Any, escaped: bool = True) -> str:
    """`value` as JSON text; `escaped`: non-ASCII as `\\u` escapes (lone surrogates too),
    else as themselves (a lone surrogate then makes the UTF-8 body invalid)."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        items = (f"{to_json(str(k), escaped)}:{to_json(v, escaped)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(to_json(v, escaped) for v in value) + "]"
    return json.dumps(value, ensure_ascii=escaped)


def body_bytes(value: Any, escaped: bool = True) -> bytes:
    return to_json(value, escaped).encode("utf-8", "surrogatepass")


MIB = 1 << 20
_surrogates = st.text(st.characters(categories=["Cs"]), min_size=1, max_size=3)
short_text = st.one_of(
    st.just(""),
    st.text(max_size=24),
    st.text(st.characters(categories=["Cc", "Cf", "Zl", "Zp", "Co"]), min_size=1, max_size=8),
    st.builds(operator.add, st.text(max_size=8), _surrogates),  # lone surrogates
    st.sampled_from(["\x00", "a\x00b", "ünïcødé 漢字 🙂", "\ud83d\ude42", "\r\n", "\\ud800"]),
)
# Past max_prompt_bytes (4096), past a 1 MiB string, and past the 2 MiB body limit.
huge_text = st.builds(
    operator.mul,
    st.sampled_from(["x", "é", "漢", "🙂", "\x00", " ", "\\"]),
    st.sampled_from([5000, 70_000, MIB]),
)
text_value = st.one_of(short_text, huge_text)
plausible_text = st.text(
    st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=24
)
NUMBERS = (0, -1, 1, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, -(2**63) - 1)
NUMBERS += (2**64, 10**400, -(10**400), 0.5, 1.0, -0.0, 1e308, -1e308, 5e-324)
RAW_TOKENS = ("NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e-400", "-0", "1E+2")
RAW_TOKENS += ("1" + "0" * 5000, "0.1e99999999999", "123456789012345678901234567890.5e10")
NUMERIC_STRINGS = ("1", "0", "-1", "1e400", "NaN", "inf", "", " 1", "0x10", "true", "null")

# Any JSON value: the random-JSON test's bodies, and one kind of wild field.
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    short_text,
)
json_value = st.recursive(
    json_leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.dictionaries(
            st.one_of(st.sampled_from(["model", "prompt", "messages", "role"]), short_text),
            children,
            max_size=6,
        ),
    ),
    max_leaves=24,
)
# Text that is no text (lone surrogates), or that a header, a C string or a log line
# cannot carry as it is.
TRICKY_TEXT = ("\ud800", "a\udfff", "\udc00\ud800", "a\nb", "\r\n", "\x00", "\x7f", "漢字")
wild = st.one_of(
    st.sampled_from(NUMBERS),
    st.sampled_from([Raw(t) for t in RAW_TOKENS]),
    st.sampled_from(NUMERIC_STRINGS),
    st.sampled_from([None, True, False, [], [[[]]], {}, {"a": {"b": []}}, list(range(100))]),
    st.sampled_from(TRICKY_TEXT),
    text_value,
    json_value,
)


# A string field's wild values: mostly text at its edges, else any wild value.
wild_text = st.one_of(st.sampled_from(TRICKY_TEXT), short_text, huge_text, wild)
model = st.sampled_from(["demo", "demo", "demo", "sim"])
wild_model = st.one_of(
    st.sampled_from(["nope", "", "demo ", "DEMO", "../demo", "a" * 129, "sim/x", "demo\n"]),
    wild_text,
)
_stops = st.one_of(plausible_text, st.lists(plausible_text, max_size=3))
_schemas = st.sampled_from([{"type": "integer"}, {"enum": ["a", "b"]}, {"type": "object"}])
_response_format = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object"])}),
    st.fixed_dictionaries(
        {"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries({"schema": _schemas})}
    ),
)
# Each field of OpenAI's requests (and vLLM's extensions) with a plausible value.
GENERATION_FIELDS: dict[str, st.SearchStrategy] = {
    "max_tokens": st.integers(1, 8),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.1, 1),
    "top_k": st.integers(-1, 64),
    "seed": st.integers(0, 1000),
    "stop": _stops,
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "n": st.just(1),
    "logit_bias": st.just({}),
    "presence_penalty": st.just(0),
    "frequency_penalty": st.just(0.0),
    "user": plausible_text,
    "response_format": _response_format,
    "guided_json": st.one_of(_schemas, st.builds(json.dumps, _schemas)),
    "guided_regex": st.sampled_from(["[0-9]{1,3}", "(yes|no)"]),
    "guided_grammar": st.just('start: "x"+'),
    # Clients' ids: mostly plain, else any text (which comes back as a header).
    "request_id": st.one_of(st.text("abcdef0123456789-", min_size=1, max_size=16), plausible_text),
    "priority": st.sampled_from(["standard", "batch", "interactive"]),  # above anonymous: 403
    "an_unknown_field": json_value,
}
COMPLETION_FIELDS = {
    **GENERATION_FIELDS,
    "logprobs": st.integers(0, 5),
    "echo": st.just(False),
    "suffix": st.none(),
    "best_of": st.just(1),
}
_tool_name = st.sampled_from(["get_weather", "note", "", "a b"])
_function = {
    "name": _tool_name,
    "description": plausible_text,
    "parameters": st.one_of(
        st.sampled_from(
            [
                {"type": "object", "properties": {"city": {"type": "string", "maxLength": 4}}},
                {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=a)"}}},
                {"type": 5},
                [1],
            ]
        ),
        json_value,
    ),
}
_tool_call = st.fixed_dictionaries(
    {
        "id": st.sampled_from(["call_1", "call_2"]),
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": _tool_name, "arguments": st.sampled_from(['{"city": "Oslo"}', "{", "7"])}
        ),
    }
)
CHAT_FIELDS = {
    **GENERATION_FIELDS,
    "max_completion_tokens": st.integers(1, 8),
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(0, 5),
    # Tools whose names may repeat or be missing, whose schemas may be no schema or one
    # the engine cannot compile; choices that may name no tool.
    "tools": st.lists(
        st.fixed_dictionaries(
            {"type": st.just("function"), "function": st.fixed_dictionaries({}, optional=_function)}
        ),
        max_size=3,
    ),
    "tool_choice": st.one_of(
        st.sampled_from(["none", "auto", "required"]),
        st.fixed_dictionaries(
            {"type": st.just("function"), "function": st.fixed_dictionaries({"name": _tool_name})}
        ),
    ),
    "parallel_tool_calls": st.booleans(),
}
# Fields whose wild values are mostly `wild_text`.
TEXT_FIELDS = {"model", "prompt", "user", "stop", "guided_json", "guided_regex", "suffix"}
TEXT_FIELDS |= {"guided_grammar", "request_id", "priority", "tool_choice"}
# Fields of which a request sets one at most (else it is refused, whatever the values).
EXCLUSIVE = (
    {"response_format", "guided_json", "guided_regex", "guided_grammar"},
    {"max_tokens", "max_completion_tokens"},
)

_role = st.sampled_from(["user", "system", "assistant", "developer", "tool"])
_part = st.fixed_dictionaries({"type": st.just("text"), "text": plausible_text})
_message = {"role": _role, "content": st.one_of(plausible_text, st.lists(_part, min_size=1))}
_wild_message = {
    **_message,
    "name": plausible_text,
    "tool_calls": st.lists(_tool_call, max_size=2),
    "tool_call_id": st.sampled_from(["call_1", "call_9"]),
}


@st.composite
def _one_wild_message(draw: st.DrawFn) -> list[Any]:
    """Plausible messages, one of them with one field wild (or not an object at all)."""
    messages = draw(st.lists(st.fixed_dictionaries(_message), min_size=1, max_size=4))
    index = draw(st.integers(0, len(messages) - 1))
    field = draw(st.sampled_from([*_wild_message, None]))
    if field is None:
        messages[index] = draw(wild)
    else:
        messages[index][field] = draw(wild_text if field in ("content", "role") else wild)
    return messages


messages = st.lists(st.fixed_dictionaries(_message), min_size=1, max_size=4)
WILD_VALUES = {
    "model": wild_model,
    "messages": st.one_of(_one_wild_message(), wild),
    "prompt": st.one_of(wild_text, st.lists(st.integers(0, 99)), st.lists(plausible_text)),
    "tokens": st.one_of(st.lists(st.sampled_from(NUMBERS), min_size=1, max_size=3), wild),
}


def wild_for(name: str) -> st.SearchStrategy:
    return WILD_VALUES.get(name, wild_text if name in TEXT_FIELDS else wild)


@st.composite
def _body(
    draw: st.DrawFn,
    required: dict[str, st.SearchStrategy],
    fields: dict[str, st.SearchStrategy],
    wilds: dict[str, st.SearchStrategy] | None = None,
) -> dict[str, Any]:
    """The required fields and some optional ones, plausible but for one thing at most:
    a wild value in one field (mostly), a required field left out, or a key no request
    has. One wild thing among plausible ones is what reaches past the first check.
    `wilds`: a field's wild values where they are not `wild_for`'s."""
    body = {name: draw(strategy) for name, strategy in required.items()}
    for name in sorted(fields):
        if name == "max_tokens" or draw(st.integers(0, 3)) == 2:
            body[name] = draw(fields[name])
    for exclusive in EXCLUSIVE:  # keep one
        for name in sorted(exclusive & body.keys())[1:]:
            del body[name]
    kind = draw(st.sampled_from(["plausible", "wild", "wild", "wild", "wild", "left out", "key"]))
    if kind == "wild":
        name = draw(st.sampled_from(sorted({*required, *fields})))
        for exclusive in EXCLUSIVE:  # the wild one alone
            if name in exclusive:
                for other in exclusive & body.keys():
                    del body[other]
        given = (wilds or {}).get(name)
        body[name] = draw(given if given is not None else wild_for(name))
    elif kind == "left out":
        del body[draw(st.sampled_from(sorted(required)))]
    elif kind == "key":
        body[draw(text_value)] = draw(wild)
    return body


# OpenAI's Responses: plausible input items (messages, a call and its output), flat
# function tools, text formats; the wild input has items of every kind (calls answered or
# not, parts and roles of any type, built-in tools' items), and the wild fields built-in
# tools, chaining to ids that exist nowhere, what clients send by default.
_text_part = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "output_text"]), "text": plausible_text}
)
_message_item = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "developer", "assistant"])},
    optional={
        "type": st.just("message"),
        "content": st.one_of(plausible_text, st.lists(_text_part, min_size=1, max_size=2)),
    },
)
_call_item = {
    "type": st.just("function_call"),
    "call_id": st.just("call_1"),
    "name": st.just("get_weather"),
    "arguments": st.sampled_from(['{"city": "Oslo"}', "{}"]),
}
_output_item = {"type": st.just("function_call_output"), "call_id": st.just("call_1")}
_answered_call = st.tuples(
    st.fixed_dictionaries(_call_item),
    st.fixed_dictionaries({**_output_item, "output": plausible_text}),
).map(list)
_input_items = st.builds(
    operator.add,
    st.lists(_message_item, min_size=1, max_size=3),
    st.one_of(st.just([]), _answered_call),
)
_wild_item = st.one_of(
    st.fixed_dictionaries(
        {"role": wild_text}, optional={"content": st.one_of(wild_text, st.lists(wild))}
    ),
    st.fixed_dictionaries(
        {"role": st.just("user"), "content": st.lists(st.fixed_dictionaries({"type": wild_text}))}
    ),
    st.fixed_dictionaries({**_call_item, "call_id": wild_text, "arguments": wild}),
    st.fixed_dictionaries({**_output_item, "call_id": wild_text, "output": wild}),
    st.fixed_dictionaries({"type": st.sampled_from(["item_reference", "reasoning", "x"])}),
    wild,
)
_flat_tool = st.fixed_dictionaries({"type": st.just("function")}, optional=_function)
_builtin_tool = st.fixed_dictionaries(
    {"type": st.sampled_from(["web_search", "file_search", "computer_use_preview", "mcp"])}
)
RESPONSES_FIELDS: dict[str, st.SearchStrategy] = {
    "instructions": plausible_text,
    "max_output_tokens": st.integers(1, 8),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.1, 1),
    "tools": st.lists(_flat_tool, max_size=3),
    "tool_choice": st.one_of(
        st.sampled_from(["none", "auto", "required"]),
        st.fixed_dictionaries({"type": st.just("function"), "name": _tool_name}),
    ),
    "parallel_tool_calls": st.booleans(),
    "text": st.fixed_dictionaries(
        {
            "format": st.one_of(
                st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object"])}),
                st.fixed_dictionaries(
                    {"type": st.just("json_schema"), "name": st.just("n"), "schema": _schemas}
                ),
            )
        }
    ),
    "stream": st.booleans(),
    "store": st.booleans(),
    "metadata": st.dictionaries(st.text(max_size=8), plausible_text, max_size=3),
    "reasoning": st.one_of(st.none(), st.just({"effort": None})),
    "include": st.lists(st.sampled_from(["reasoning.encrypted_content"]), max_size=1),
    "truncation": st.sampled_from(["auto", "disabled"]),
    "user": plausible_text,
    "seed": st.integers(0, 1000),
    "an_unknown_field": json_value,
}
WILD_VALUES["input"] = st.one_of(
    wild_text,
    st.builds(
        lambda items, odd, at: [*items[:at], odd, *items[at:]],
        _input_items,
        _wild_item,
        st.integers(0, 4),
    ),
    wild,
)
WILD_VALUES["tools"] = st.one_of(st.lists(st.one_of(_flat_tool, _builtin_tool), min_size=1), wild)
WILD_VALUES["tool_choice"] = st.one_of(
    wild_text, st.fixed_dictionaries({"type": st.sampled_from(["web_search_preview", "mcp"])})
)
WILD_VALUES["metadata"] = st.one_of(
    st.dictionaries(st.text(max_size=70), st.text(max_size=600), min_size=1, max_size=18), wild
)
WILD_VALUES["reasoning"] = st.one_of(st.fixed_dictionaries({"effort": wild_text}), wild)
RESPONSES_FIELDS["previous_response_id"] = st.sampled_from(["resp_0", "resp_" + "f" * 32])
RESPONSES_FIELDS["background"] = st.just(False)
TEXT_FIELDS |= {"instructions", "previous_response_id"}
responses_body = _body(
    {"model": model, "input": st.one_of(plausible_text, _input_items)}, RESPONSES_FIELDS
)

_prompt = {"model": model, "prompt": plausible_text}
completion_body = _body(_prompt, COMPLETION_FIELDS)
chat_body = _body({"model": model, "messages": messages}, CHAT_FIELDS)
tokenize_body = st.one_of(
    _body(_prompt, {"add_special_tokens": st.booleans()}),
    _body({"model": model, "messages": messages}, {"add_generation_prompt": st.booleans()}),
)
_token_ids = st.lists(st.integers(0, 4095), max_size=16)
detokenize_body = _body({"model": model, "tokens": _token_ids}, {"extra": json_value})
BODIES = {
    "/v1/completions": completion_body,
    "/v1/chat/completions": chat_body,
    "/v1/completions/render": completion_body,  # vLLM's render: generation's bodies
    "/v1/chat/completions/render": chat_body,
    "/tokenize": tokenize_body,
    "/detokenize": detokenize_body,
    "/v1/responses": responses_body,
}

CONTENT_TYPES = (
    "application/json",
    "application/json; charset=utf-8",
    "application/vnd.api+json",
    "APPLICATION/JSON",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "",
    ";",
    "application/json;;;=",
    "*/*",
)
content_type = st.one_of(
    st.none(),
    st.sampled_from(CONTENT_TYPES),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40).map(str.strip),
)
# Bytes that are not UTF-8: a stray continuation, a cut sequence, an encoded surrogate,
# an overlong slash, bytes UTF-8 never has.
BAD_UTF8 = (b"\x80", b"\xc3", b"\xe6\xbc", b"\xed\xa0\x80", b"\xc0\xaf", b"\xfe\xff", b"\xf8")


@st.composite
def raw_body(draw: st.DrawFn, bodies: st.SearchStrategy) -> bytes:
    """Random bytes, or a plausible body cut short, with bytes flipped, with bytes that
    are not UTF-8 put in, behind a byte-order mark, or as whitespace alone; or a huge
    one."""
    kinds = ["random", "truncated", "flipped", "bad-utf8", "bom", "blank", "huge"]
    kind = draw(st.sampled_from(kinds))
    if kind == "random":
        return draw(st.binary(max_size=512))
    if kind == "huge":  # a prompt of 1 MiB (under the 2 MiB limit), or of 3 MiB
        size = draw(st.sampled_from([MIB, 3 * MIB]))
        return b'{"model": "demo", "prompt": "' + b"x" * size + b'"}'
    if kind == "blank":
        return draw(st.sampled_from([b"", b" ", b"\r\n\t ", b"\x00"]))
    encoded = bytearray(body_bytes(draw(bodies), escaped=draw(st.booleans()))[:8192])
    if kind == "bom":
        return b"\xef\xbb\xbf" + bytes(encoded)
    if kind == "truncated" or not encoded:
        return bytes(encoded[: draw(st.integers(0, len(encoded)))])
    if kind == "bad-utf8":
        at = draw(st.integers(0, len(encoded)))
        return bytes(encoded[:at] + draw(st.sampled_from(BAD_UTF8)) + encoded[at:])
    for _ in range(draw(st.integers(1, 8))):
        encoded[draw(st.integers(0, len(encoded) - 1))] = draw(st.integers(0, 255))
    return bytes(encoded)


ROUTES = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")
ROUTES += ("/v1/models", "/v1/models/demo", "/health", "/version", "/metrics")
ROUTES += ("/v1/responses", "/v1/responses/resp_0", "/v1/responses/")
ROUTES += ("/v1/messages", "/v1/messages/count_tokens", "/v1/messages?beta=true")
ROUTES += ("/v1/completions/render", "/v1/chat/completions/render")


# A path: a route, a route with a tail, a near miss, or any text (percent-encoded by the
# client), and methods HTTP has (and some it has not).
def _quoted(text: str) -> str:
    return quote(text, safe="", errors="surrogatepass")


path = st.one_of(
    st.sampled_from(ROUTES),
    st.builds(operator.add, st.sampled_from(ROUTES), st.sampled_from(["/", "//", "/x", "?a=1"])),
    st.sampled_from(["/", "/v1", "/v1/", "/v2/completions", "/v1/models/", "/%2e%2e/etc"]),
    st.builds(operator.add, st.just("/v1/models/"), short_text.map(_quoted)),
    st.builds(operator.add, st.just("/"), st.text(max_size=40).map(_quoted)),
    st.builds(operator.add, st.just("/v1/models/"), st.sampled_from(["%ff", "%00", "%2F", "%"])),
)
method = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE"])
# Header values on a plausible request (bytes, as sent): visible ASCII, obs-text, long
# ones (four of them stay under the 16 KiB a request's head may have).
header_value = st.one_of(
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=64).map(str.encode),
    st.binary(max_size=32).map(lambda b: bytes(c for c in b if c > 0x20 and c != 0x7F)),
    st.builds(operator.mul, st.sampled_from([b"a", b"\xe9"]), st.integers(1000, 3000)),
)
HEADER_NAMES = ("authorization", "x-request-id", "content-type", "traceparent", "accept")
HEADER_NAMES += ("x-gateway-inference-objective", "x-gateway-inference-fairness-id", "x-junk")
headers = st.dictionaries(st.sampled_from(HEADER_NAMES), header_value, max_size=4)
