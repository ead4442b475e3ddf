"""Every command the docs show still parses against the tools they name.

Each ```console/```sh/```shell/```bash block of README.md and docs/*.md is read as shell:
`\\` continuations and quotes spanning lines are joined, `$ ` prompts mark commands in
console blocks, environment-variable prefixes are dropped, and `&&`, `|` and `;` split a
line into commands. Then:
- `inferwire ...` (and `make serve ARGS="..."`) is parsed by the real command line: the
  Typer app behind the installed `inferwire` console script, found by calling the entry
  point, whatever module holds it; options, their values and arguments, without running;
- `grpcurl ...` uses only flags of the pinned grpcurl (scripts/install_tools.sh), names a
  service, method or symbol the server has, and its `-d` JSON is a valid request message;
- `grpc_health_probe ...` uses only that tool's flags, under the name the tools script
  installs it with.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import typer
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health_pb2
from tritonclient.grpc import service_pb2 as kserve_pb2

from inferwire.v1 import inference_pb2

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
SHELL_LANGUAGES = {"console", "sh", "shell", "bash"}
SEPARATORS = {";", "&", "&&", "|", "||", "(", ")"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")

# `grpcurl -help` of v1.9.4: name -> takes a value (False: a boolean flag).
GRPCURL_FLAGS = {
    "H": True,
    "allow-unknown-fields": False,
    "alts": False,
    "alts-handshaker-service": True,
    "alts-target-service-account": True,
    "authority": True,
    "cacert": True,
    "cert": True,
    "connect-timeout": True,
    "d": True,
    "emit-defaults": False,
    "expand-headers": False,
    "format": True,
    "format-error": False,
    "help": False,
    "import-path": True,
    "insecure": False,
    "keepalive-time": True,
    "key": True,
    "max-msg-sz": True,
    "max-time": True,
    "msg-template": False,
    "plaintext": False,
    "proto": True,
    "proto-out-dir": True,
    "protoset": True,
    "protoset-out": True,
    "reflect-header": True,
    "rpc-header": True,
    "servername": True,
    "unix": False,
    "use-reflection": False,
    "user-agent": True,
    "v": False,
    "version": False,
    "vv": False,
}
# `grpc_health_probe -help` of v0.4.62.
HEALTH_PROBE_FLAGS = {
    "addr": True,
    "alts": False,
    "connect-timeout": True,
    "gzip": False,
    "rpc-header": True,
    "rpc-timeout": True,
    "service": True,
    "spiffe": False,
    "tls": False,
    "tls-ca-cert": True,
    "tls-client-cert": True,
    "tls-client-key": True,
    "tls-no-verify": False,
    "tls-server-name": True,
    "user-agent": True,
    "v": False,
    "version": False,
}
REFLECTION_SERVICES = {
    "grpc.reflection.v1.ServerReflection": {"ServerReflectionInfo"},
    "grpc.reflection.v1alpha.ServerReflection": {"ServerReflectionInfo"},
}


@dataclass(frozen=True)
class DocCommand:
    where: str  # "docs/security.md:120"
    words: tuple[str, ...]  # the program first, assignments and redirections dropped


# Reading the docs


def shell_blocks(text: str) -> Iterator[tuple[str, int, list[str]]]:
    """(language, line number of the block's first line, its lines, de-indented)."""
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        fence = re.match(r"^(\s*)```\s*(\w*)", lines[index])
        if fence is None:
            index += 1
            continue
        indent, language = fence.group(1), fence.group(2).lower()
        start = index + 1
        index = start
        while index < len(lines) and not lines[index].strip().startswith("```"):
            index += 1
        body = [
            line[len(indent) :] if line.startswith(indent) else line for line in lines[start:index]
        ]
        index += 1
        if language in SHELL_LANGUAGES:
            yield language, start + 1, body


def _incomplete(text: str) -> bool:
    if text.endswith("\\"):
        return True
    try:
        shlex.split(text, comments=True)
    except ValueError:  # an open quote: the command goes on on the next line
        return True
    return False


def command_lines(language: str, lines: list[str]) -> Iterator[tuple[int, str]]:
    """(offset in the block, one whole command line) of a shell or console block."""
    index = 0
    while index < len(lines):
        line = lines[index].strip()
        offset = index
        index += 1
        if language == "console":
            if not line.startswith("$ "):
                continue  # output
            line = line[2:]
        if not line or line.startswith("#"):
            continue
        while _incomplete(line) and index < len(lines):
            line = (line[:-1] if line.endswith("\\") else line + "\n") + lines[index].strip()
            index += 1
        yield offset, line


def simple_commands(line: str) -> Iterator[list[str]]:
    """The simple commands of one line: split at ;, &, &&, |, ||, with assignments and
    redirections removed."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    words: list[str] = []
    redirect = False
    for token in lexer:
        if token in SEPARATORS:
            yield words
            words = []
        elif redirect:
            redirect = False
        elif set(token) <= set("<>&"):
            redirect = True  # the next token is the redirection's target
            if words and words[-1] in {"0", "1", "2"}:
                words.pop()  # the descriptor of 2>file (the lexer splits it off)
        elif not words and ASSIGNMENT.match(token):
            continue  # VAR=value before the program
        else:
            words.append(token)
    yield words


def program(words: list[str]) -> str:
    return words[0].rsplit("/", 1)[-1] if words else ""


def checked(words: list[str]) -> bool:
    name = program(words)
    if name == "make":
        return words[1:2] == ["serve"]
    return name in CHECKERS


def doc_commands(path: Path, text: str) -> list[DocCommand]:
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for language, first_line, lines in shell_blocks(text):
        for offset, line in command_lines(language, lines):
            for words in simple_commands(line):
                if checked(words):
                    found.append(DocCommand(f"{where}:{first_line + offset}", tuple(words)))
    return found


# inferwire: the real Typer app


class _FoundApp(BaseException):
    """Raised from Typer.__call__ to hand the entry point's app back, running nothing."""

    def __init__(self, app: typer.Typer) -> None:
        super().__init__()
        self.app = app


def _inferwire_app() -> typer.Typer:
    (entry_point,) = entry_points(group="console_scripts", name="inferwire")
    main = entry_point.load()

    def capture(self: typer.Typer, *args: Any, **kwargs: Any) -> None:
        raise _FoundApp(self)

    patch = pytest.MonkeyPatch()
    patch.setattr(typer.Typer, "__call__", capture)
    try:
        main()
    except _FoundApp as found:
        return found.app
    finally:
        patch.undo()
    raise AssertionError("the inferwire entry point never called a Typer app")


@functools.cache
def inferwire_command() -> Any:
    """The (click) command of the `inferwire` console script."""
    return typer.main.get_command(_inferwire_app())


def check_inferwire(args: list[str]) -> str | None:
    """None when `inferwire ARGS` parses; else the parser's complaint."""
    command, name, parent = inferwire_command(), "inferwire", None
    try:
        while True:
            context = command.make_context(name, list(args), parent=parent)
            if not hasattr(command, "get_command"):
                return None  # a leaf command, parsed whole
            # click keeps the subcommand's name apart from its arguments.
            protected = getattr(context, "_protected_args", None)
            if protected is None:
                protected = getattr(context, "protected_args", [])
            rest = [*protected, *context.args]
            if not rest:
                return None  # a group alone prints its help
            name, args = rest[0], rest[1:]
            sub = command.get_command(context, name)
            if sub is None:
                return f"no such command {name!r} (after {context.command_path!r})"
            command, parent = sub, context
    except Exception as error:
        if type(error).__name__ == "Exit" and getattr(error, "exit_code", 0) == 0:
            return None  # --help, --version
        format_message = getattr(error, "format_message", None)
        message = format_message() if callable(format_message) else str(error)
        return f"{type(error).__name__}: {message}"


def check_make(args: list[str]) -> str | None:
    """`make serve ARGS="..."`: the ARGS are flags of `inferwire serve`."""
    extra = [arg.split("=", 1)[1] for arg in args[1:] if arg.startswith("ARGS=")]
    return check_inferwire(["serve", *(word for value in extra for word in shlex.split(value))])


# grpcurl and grpc_health_probe: Go's flag package


def go_flags(
    args: list[str], flags: dict[str, bool], tool: str
) -> tuple[dict[str, list[str]], list[str]] | str:
    """Parse like Go's flag package: (values by flag, positional arguments) or an error."""
    values: dict[str, list[str]] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            index += 1
            break
        if not arg.startswith("-") or arg == "-":
            break  # the first non-flag ends the flags
        name, has_value, value = arg.lstrip("-").partition("=")
        if name not in flags:
            return f"{tool} has no flag -{name}"
        index += 1
        if flags[name] and not has_value:
            if index == len(args):
                return f"{tool} -{name} needs a value"
            value = args[index]
            index += 1
        elif not flags[name] and has_value and value.lower() not in {"true", "false", "1", "0"}:
            return f"{tool} -{name} is a boolean flag, got {value!r}"
        values.setdefault(name, []).append(value)
    return values, args[index:]


# Importing the generated modules registered these files in the default pool; the KServe
# v2 service's come from tritonclient (api/kserve).
SERVED_FILES = (inference_pb2.DESCRIPTOR, health_pb2.DESCRIPTOR, kserve_pb2.DESCRIPTOR)


def _pool() -> descriptor_pool.DescriptorPool:
    return descriptor_pool.Default()


def _service(name: str) -> ServiceDescriptor | None:
    try:
        return _pool().FindServiceByName(name)
    except KeyError:
        return None


def _known_symbol(symbol: str) -> bool:
    pool = _pool()
    finders: list[Callable[[str], object]] = [
        pool.FindServiceByName,
        pool.FindMessageTypeByName,
        pool.FindEnumTypeByName,
        pool.FindMethodByName,
        pool.FindFieldByName,
    ]
    for find in finders:
        try:
            find(symbol)
        except KeyError:
            continue
        return True
    return symbol in REFLECTION_SERVICES


def _check_method(target: str, data: str | None) -> str | None:
    service_name, _, method_name = target.replace("/", ".").rpartition(".")
    if service_name in REFLECTION_SERVICES:
        known = method_name in REFLECTION_SERVICES[service_name]
        return None if known else f"{service_name} has no method {method_name!r}"
    service = _service(service_name)
    if service is None:
        return f"the server has no service {service_name!r}"
    method = service.methods_by_name.get(method_name)
    if method is None:
        return f"{service_name} has no method {method_name!r}"
    if data is None or data.startswith("@"):
        return None
    request_type = message_factory.GetMessageClass(method.input_type)
    try:
        json_format.Parse(data, request_type())
    except (json_format.ParseError, json.JSONDecodeError) as error:
        return f"-d is not a {method.input_type.full_name}: {error}"
    return None


def check_grpcurl(args: list[str]) -> str | None:
    parsed = go_flags(args, GRPCURL_FLAGS, "grpcurl")
    if isinstance(parsed, str):
        return parsed
    flags, positional = parsed
    if "help" in flags or "version" in flags:
        return None
    if not positional:
        return "grpcurl needs an address"
    late_flags = [arg for arg in positional if arg.startswith("-")]
    if late_flags:
        return f"grpcurl reads flags only before the address: {late_flags}"
    if len(positional) == 1:
        return "grpcurl needs list, describe or a method after the address"
    verb, rest = positional[1], positional[2:]
    if verb in {"list", "describe"}:
        if len(rest) > 1:
            return f"grpcurl {verb} takes one symbol, got {rest}"
        if verb == "list" and rest and _service(rest[0]) is None:
            return f"the server has no service {rest[0]!r}"
        if verb == "describe" and rest and not _known_symbol(rest[0]):
            return f"the server has no symbol {rest[0]!r}"
        return None
    if rest:
        return f"unexpected arguments after the method: {rest}"
    if flags.get("format", ["json"])[-1] != "json":
        return _check_method(verb, None)
    return _check_method(verb, flags.get("d", [None])[-1])


def check_health_probe(args: list[str]) -> str | None:
    parsed = go_flags(args, HEALTH_PROBE_FLAGS, "grpc_health_probe")
    if isinstance(parsed, str):
        return parsed
    flags, positional = parsed
    if positional:
        return f"grpc_health_probe takes no arguments, got {positional}"
    if "addr" not in flags and "version" not in flags:
        return "grpc_health_probe needs -addr"
    return None


def check_wrong_probe_name(args: list[str]) -> str | None:
    return "the tools script installs grpc_health_probe (underscores), not grpc-health-probe"


CHECKERS: dict[str, Callable[[list[str]], str | None]] = {
    "inferwire": check_inferwire,
    "make": check_make,
    "grpcurl": check_grpcurl,
    "grpc_health_probe": check_health_probe,
    "grpc-health-probe": check_wrong_probe_name,
}


def check(command: DocCommand) -> str | None:
    return CHECKERS[program(list(command.words))](list(command.words[1:]))


# The tests

DOCUMENTED = [command for path in DOC_FILES for command in doc_commands(path, path.read_text())]


@pytest.fixture(autouse=True)
def _no_inferwire_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # Option defaults from INFERWIRE_* variables must not change what a doc line means.
    for name in [name for name in os.environ if name.startswith("INFERWIRE_")]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize("command", DOCUMENTED, ids=[command.where for command in DOCUMENTED])
def test_documented_command_parses(command: DocCommand) -> None:
    problem = check(command)
    assert problem is None, f"{command.where}: {shlex.join(command.words)}\n{problem}"


def test_the_docs_show_each_kind_of_command() -> None:
    programs = {program(list(command.words)) for command in DOCUMENTED}
    assert {"inferwire", "grpcurl", "grpc_health_probe", "make"} <= programs
    readme = [command for command in DOCUMENTED if command.where.startswith("README.md:")]
    assert {"inferwire", "grpcurl"} <= {program(list(command.words)) for command in readme}


EXAMPLE = """
Text.

```console
$ inferwire infer demo "To be" \\
    --max-tokens 8 --usage
 or not to be
finish_reason=LENGTH
$ INFERWIRE_ADDRESS=localhost:6000 inferwire models list && inferwire health
```

  ```sh
  grpcurl -plaintext -d '{
    "model": "demo", "prompt": "Hi"
  }' localhost:50051 inferwire.v1.InferenceService/Infer   # a comment
  printf %s "$TOKEN" | inferwire token hash 2>/dev/null
  make serve ARGS="--address 127.0.0.1:6000"
  kubectl apply -k deploy/kubernetes/base
  ```

```yaml
inferwire: not a command
```
"""


def test_commands_are_read_from_console_and_shell_blocks() -> None:
    words = [command.words for command in doc_commands(ROOT / "x.md", EXAMPLE)]
    assert words == [
        ("inferwire", "infer", "demo", "To be", "--max-tokens", "8", "--usage"),
        ("inferwire", "models", "list"),
        ("inferwire", "health"),
        (
            "grpcurl",
            "-plaintext",
            "-d",
            '{\n"model": "demo", "prompt": "Hi"\n}',
            "localhost:50051",
            "inferwire.v1.InferenceService/Infer",
        ),
        ("inferwire", "token", "hash"),
        ("make", "serve", "ARGS=--address 127.0.0.1:6000"),
    ]
    for command in doc_commands(ROOT / "x.md", EXAMPLE):
        assert check(command) is None, command


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ('inferwire infer demo "x" --max-tokenz 3', "--max-tokenz"),
        ("inferwire infer demo x --max-tokens", "--max-tokens"),
        ("inferwire infer demo x --max-tokens many", "--max-tokens"),
        ("inferwire infer", "MODEL"),
        ("inferwire models lst", "lst"),
        ("inferwire token new --nam a", "--nam"),
        ('make serve ARGS="--adress 127.0.0.1:6000"', "--adress"),
        ("grpcurl -plaintxt localhost:50051 list", "-plaintxt"),
        ("grpcurl -plaintext localhost:50051 inferwire.v1.InferenceService/Inferr", "Inferr"),
        ("grpcurl -plaintext localhost:50051 inferwire.v2.InferenceService/Infer", "v2"),
        ("grpcurl -plaintext localhost:50051 describe inferwire.v1.NoSuchMessage", "NoSuch"),
        ("grpcurl -plaintext localhost:50051 list -plaintext", "only before the address"),
        ("grpcurl -plaintext localhost:50051 list a b", "takes one symbol"),
        (
            """grpcurl -plaintext -d '{"model":"demo","promt":"x"}' localhost:50051 """
            "inferwire.v1.InferenceService/Infer",
            "promt",
        ),
        ("grpcurl -d", "-d needs a value"),
        ("grpcurl -plaintext localhost:50051", "after the address"),
        ("grpc_health_probe -addr localhost:50051 -services model/demo", "-services"),
        ("grpc-health-probe -addr localhost:50051", "grpc_health_probe"),
    ],
)
def test_a_command_the_tools_do_not_take_fails(line: str, complaint: str) -> None:
    (command,) = doc_commands(ROOT / "x.md", f"```sh\n{line}\n```\n")
    problem = check(command)
    assert problem is not None and complaint in problem, problem


@pytest.mark.parametrize(
    "line",
    [
        "grpcurl -plaintext localhost:50051 describe inferwire.v1.InferenceService.Infer",
        "grpcurl -plaintext localhost:50051 describe inferwire.v1.InferRequest",
        "grpcurl -plaintext localhost:50051 list grpc.health.v1.Health",
        """grpcurl -plaintext -d '{"service":"model/demo"}' localhost:50051 """
        "grpc.health.v1.Health/Check",
        "grpc_health_probe -addr=127.0.0.1:50051 -service=model/demo",
        "inferwire --version",
        "inferwire infer --help",
    ],
)
def test_valid_commands_pass(line: str) -> None:
    (command,) = doc_commands(ROOT / "x.md", f"```sh\n{line}\n```\n")
    assert check(command) is None
