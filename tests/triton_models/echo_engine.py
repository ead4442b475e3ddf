"""What the echo models share, free of Triton: the generation and a thread per request.

The models import it as `echo_engine` through a symlink next to each model.py (Triton's
Python backend stub puts the model's version folder on sys.path); the Triton tests
import it as `tests.triton_models.echo_engine` to know what the models generate.
See README.md for the rules.
"""

import json
import os
import re
import string
import threading
import time
import zlib

try:  # Python 3.11+
    from re import _constants as _re_constants
    from re import _parser as _re_parser
except ImportError:  # pragma: no cover - older Pythons
    import sre_constants as _re_constants
    import sre_parse as _re_parser


def echo_token(words, index):
    """Token `index`: the prompt word at that position, cycling, reversed."""
    return words[index % len(words)][::-1]


def echo_text(prompt, tokens):
    """The text of the first `tokens` tokens, joined with single spaces."""
    words = prompt.split() or ["?"]
    return " ".join(echo_token(words, i) for i in range(tokens))


# A prompt whose first word is `fail:<CODE>` (a pb_utils.TritonError code name, such as
# NOT_FOUND, INVALID_ARG, UNAVAILABLE or CANCELLED) makes the model answer with that error.
FAIL_PREFIX = "fail:"


class RequestedFailure(Exception):
    """The prompt asked for an error with Triton code `code` (a TritonError attribute)."""

    def __init__(self, code):
        super().__init__(f"failing on request with {code}")
        self.code = code


def check_requested_failure(prompt):
    """Raise RequestedFailure when the prompt's first word is `fail:<CODE>`."""
    words = prompt.split()
    if words and words[0].startswith(FAIL_PREFIX):
        raise RequestedFailure(words[0][len(FAIL_PREFIX) :])


def token_delay_s():
    return float(os.environ.get("INFERWIRE_TRITON_TOKEN_DELAY_S", "0.005"))


class Generation:
    """One request's generation: its rules, and the text, tokens and finish so far.

    Without a constraint token *i* is the echo token (with a space before all but the
    first); with one (`guided`, see `constrained_text`) the tokens are the constrained
    text in pieces of CONSTRAINED_PIECE characters.
    """

    def __init__(
        self, prompt, max_tokens, stops, include_stop, guided=None, min_tokens=0, ignore_eos=False
    ):
        self.prompt = prompt
        self.words = prompt.split() or ["?"]
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.ignore_eos = ignore_eos
        self.stops = stops
        self.include_stop = include_stop
        self.text = ""
        self.tokens = 0
        self.finish = None
        self.cancelled = False
        self.pieces = []  # the text each generated token added
        if guided is None:
            self._planned = None
        else:
            text = constrained_text(guided, self.words)
            step = CONSTRAINED_PIECE
            self._planned = [text[i : i + step] for i in range(0, len(text), step)]

    def _piece(self, index):
        if self._planned is not None:
            return self._planned[index]
        word = echo_token(self.words, index)
        return word if index == 0 else f" {word}"

    def run(self, is_cancelled, delay_s):
        """Generate token by token; yield the text each token added to `text`.

        Ends on cancellation (`cancelled`), at `max_tokens` (finish `length`), after three
        times the prompt's words or the whole constrained text (`stop`; not before
        `min_tokens`, and never with `ignore_eos`), or when a stop string appears in the
        text (`stop`): the text is cut at the stop string, or after it with `include_stop`.
        """
        natural_end = 3 * len(self.words) if self._planned is None else len(self._planned)
        natural_end = float("inf") if self.ignore_eos else max(natural_end, self.min_tokens)
        while True:
            if is_cancelled():
                self.cancelled = True
                return
            if self.tokens >= self.max_tokens:
                self.finish = "length"
                return
            if self.tokens >= natural_end:
                self.finish = "stop"
                return
            time.sleep(delay_s)
            before = len(self.text)
            piece = self._piece(self.tokens)
            self.pieces.append(piece)
            self.text += piece
            self.tokens += 1
            for stop in self.stops:
                index = self.text.find(stop)
                if index >= 0:
                    end = index + len(stop) if self.include_stop else index
                    self.text = self.text[:end]
                    self.finish = "stop"
                    break
            yield self.text[before:]
            if self.finish is not None:
                return

    def record(self, model, request_id, stream, params, forwarded=None):
        """Write what the request did to $INFERWIRE_TRITON_RECORD_DIR, if set.

        `forwarded`: the request parameters Triton made from gRPC headers
        (--grpc-header-forward-pattern), such as the caller's `traceparent`.
        """
        directory = os.environ.get("INFERWIRE_TRITON_RECORD_DIR")
        if not directory or not request_id:
            return
        record = {
            "tokens": self.tokens,
            "cancelled": self.cancelled,
            "finish": self.finish,
            "stream": stream,
            "params": params,
            "prompt": self.prompt,
            "forwarded": forwarded or {},
        }
        path = os.path.join(directory, f"{model}-{request_id}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)


class ThreadPerRequest:
    """`execute` for a decoupled model: each request generates on a thread of its own.

    A subclass defines `_generate(request, sender)` and `_fail(sender, message, code)`,
    where `code` names a pb_utils.TritonError code (None: Triton's default, INTERNAL).
    """

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._run, args=(request,), daemon=True).start()
        return None

    def _run(self, request):
        sender = request.get_response_sender()
        try:
            self._generate(request, sender)
        except RequestedFailure as exc:
            self._fail(sender, str(exc), exc.code)
        except Exception as exc:
            self._fail(sender, f"{type(exc).__name__}: {exc}", None)


# ---- log-probabilities, in the vLLM backend's `logprobs` output format --------------


def token_id(text):
    """A stable id for a token's text (the echo models have no vocabulary)."""
    return zlib.crc32(text.encode()) % 50000


def token_logprobs(piece, index, top):
    """Token `index` (text `piece`) as one entry of vLLM's logprobs list.

    A dict from token id to {logprob, rank, decoded_token}: the chosen token first, with
    rank 1 (the echo models decode greedily), then `top` - 1 less likely alternatives.
    """
    chosen = -0.05 * (1 + index % 5)
    entry = {str(token_id(piece)): {"logprob": chosen, "rank": 1, "decoded_token": piece}}
    for rank in range(2, top + 1):
        alternative = f"{piece}~{rank}"
        entry[str(token_id(alternative))] = {
            "logprob": chosen - 0.5 * (rank - 1),
            "rank": rank,
            "decoded_token": alternative,
        }
    return entry


# ---- constrained output: vLLM's guided_decoding {json | regex | grammar} --------------

# The text of a constrained generation comes in tokens of this many characters.
CONSTRAINED_PIECE = 4


class UnsupportedConstraint(ValueError):
    """A guided_decoding request these models cannot follow (answered with INVALID_ARG)."""


def constrained_text(guided, words):
    """The text the models generate under vLLM's `guided_decoding` (a dict or its JSON).

    `json` (a schema): an instance built from the schema, strings taken from the echo
    words; `regex`: a string that fully matches, preferring the echo text's characters;
    `grammar` (Lark or EBNF rules of literals, rule names and /regex/ terminals): the
    first alternative of each rule, from `start` (or `root`).
    """
    if isinstance(guided, str):
        guided = json.loads(guided)
    kinds = [k for k in ("json", "regex", "grammar", "choice") if guided.get(k) is not None]
    if len(kinds) != 1:
        raise UnsupportedConstraint(f"guided_decoding needs exactly one constraint, got {kinds}")
    source = _Source(" ".join(echo_token(words, i) for i in range(3 * len(words))))
    kind = kinds[0]
    if kind == "json":
        schema = guided["json"]
        schema = json.loads(schema) if isinstance(schema, str) else schema
        return json.dumps(_json_instance(schema, source))
    if kind == "regex":
        return _regex_text(guided["regex"], source)
    if kind == "choice":
        return str(guided["choice"][0])
    return _grammar_text(guided["grammar"], source)


class _Source:
    """The echo text, read in order: the characters a constrained model prefers."""

    FALLBACK = string.ascii_lowercase + string.digits + string.ascii_uppercase + " _-.,:;!?/"

    def __init__(self, text):
        self.text = text
        self.at = 0

    def char(self, fits):
        if self.at < len(self.text) and fits(self.text[self.at]):
            self.at += 1
            return self.text[self.at - 1]
        self.at += 1
        for candidate in self.FALLBACK + string.printable:
            if fits(candidate):
                return candidate
        raise UnsupportedConstraint("a character class matches no printable character")

    def word(self):
        words = self.text.split()
        return words[self.at % len(words)] if words else "x"


def _json_instance(schema, source, depth=0):
    if depth > 8 or not isinstance(schema, dict):
        raise UnsupportedConstraint("the JSON schema is too deep or not an object")
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for combinator in ("anyOf", "oneOf"):
        if combinator in schema:
            return _json_instance(schema[combinator][0], source, depth + 1)
    unsupported = {"$ref", "allOf", "not", "if", "patternProperties"} & schema.keys()
    if unsupported:
        raise UnsupportedConstraint(f"JSON schema keyword {sorted(unsupported)[0]} is unsupported")
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties = schema.get("properties", {})
        value = {name: _json_instance(sub, source, depth + 1) for name, sub in properties.items()}
        for name in schema.get("required", []):
            value.setdefault(name, source.word())
        return value
    if kind == "array":
        count = max(schema.get("minItems", 1), 1)
        count = min(count, schema.get("maxItems", count))
        return [_json_instance(schema.get("items", {}), source, depth + 1) for _ in range(count)]
    if kind == "string":
        if "pattern" in schema:
            return _regex_text(schema["pattern"], source, anchored=False)
        text = source.word()
        source.at += len(text) + 1
        text = text[: schema.get("maxLength", len(text))]
        return text + "x" * max(0, schema.get("minLength", 0) - len(text))
    if kind in ("integer", "number"):
        value = len(source.word())
        if "minimum" in schema:
            value = max(value, schema["minimum"])
        if "exclusiveMinimum" in schema:
            value = max(value, schema["exclusiveMinimum"] + 1)
        if "maximum" in schema:
            value = min(value, schema["maximum"])
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    raise UnsupportedConstraint(f"JSON schema type {kind!r} is unsupported")


def _regex_text(pattern, source, anchored=True):
    """A string that matches `pattern` (fully, or with re.search when not `anchored`)."""
    try:
        parsed = _re_parser.parse(pattern)
    except re.error as exc:
        raise UnsupportedConstraint(f"invalid regex: {exc}") from None
    text = _regex_items(parsed, source)
    matched = re.fullmatch(pattern, text) if anchored else re.search(pattern, text)
    if not matched:
        raise UnsupportedConstraint("this regex is beyond what the echo models can follow")
    return text


def _regex_items(items, source):
    return "".join(_regex_item(op, arg, source) for op, arg in items)


def _regex_item(op, arg, source):
    c = _re_constants
    if op is c.LITERAL:
        return chr(arg)
    if op is c.NOT_LITERAL:
        return source.char(lambda ch: ord(ch) != arg)
    if op is c.ANY:
        return source.char(lambda ch: ch != "\n")
    if op is c.IN:
        return source.char(lambda ch: _in_class(ch, arg))
    if op is c.BRANCH:
        return _regex_items(arg[1][0], source)
    if op is c.SUBPATTERN:
        return _regex_items(arg[-1], source)
    if op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)):
        low, high, item = arg
        count = max(low, min(high, 3))
        return "".join(_regex_items(item, source) for _ in range(count))
    if op is c.AT:
        return ""
    raise UnsupportedConstraint(f"regex construct {op} is unsupported")


def _in_class(ch, members):
    c = _re_constants
    negate = False
    found = False
    for op, arg in members:
        if op is c.NEGATE:
            negate = True
        elif op is c.LITERAL:
            found |= ord(ch) == arg
        elif op is c.RANGE:
            found |= arg[0] <= ord(ch) <= arg[1]
        elif op is c.CATEGORY:
            found |= _CATEGORIES[arg](ch)
        else:
            raise UnsupportedConstraint(f"regex class member {op} is unsupported")
    return found != negate


_CATEGORIES = {
    _re_constants.CATEGORY_DIGIT: str.isdigit,
    _re_constants.CATEGORY_NOT_DIGIT: lambda ch: not ch.isdigit(),
    _re_constants.CATEGORY_SPACE: str.isspace,
    _re_constants.CATEGORY_NOT_SPACE: lambda ch: not ch.isspace(),
    _re_constants.CATEGORY_WORD: lambda ch: ch.isalnum() or ch == "_",
    _re_constants.CATEGORY_NOT_WORD: lambda ch: not (ch.isalnum() or ch == "_"),
}


_RULE = re.compile(r"^\s*\??([A-Za-z_][\w]*)\s*(?::|::=)\s*(.*)$")
_GRAMMAR_ITEM = re.compile(r'\s*("(?:[^"\\]|\\.)*"|/(?:[^/\\]|\\.)*/|[A-Za-z_]\w*)')


def _grammar_text(grammar, source):
    rules = {}
    for line in grammar.splitlines():
        line = line.split("//")[0].strip()
        if not line:
            continue
        rule = _RULE.match(line)
        if rule is None:
            raise UnsupportedConstraint(f"grammar line {line!r} is unsupported")
        rules[rule.group(1)] = rule.group(2)
    start = "start" if "start" in rules else "root"
    if start not in rules:
        raise UnsupportedConstraint("the grammar has no start (or root) rule")
    return _grammar_rule(rules, start, source, 0)


def _grammar_rule(rules, name, source, depth):
    if name not in rules or depth > 16:
        raise UnsupportedConstraint(f"grammar rule {name!r} is undefined or too deep")
    alternative = rules[name].split("|")[0].strip()
    text, at = "", 0
    while at < len(alternative):
        item = _GRAMMAR_ITEM.match(alternative, at)
        if item is None:
            raise UnsupportedConstraint(f"grammar syntax {alternative[at:]!r} is unsupported")
        token, at = item.group(1), item.end()
        if token.startswith('"'):
            text += json.loads(token)
        elif token.startswith("/"):
            text += _regex_text(token[1:-1], source)
        else:
            text += _grammar_rule(rules, token, source, depth + 1)
    return text
