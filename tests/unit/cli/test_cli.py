"""The `inferwire` command line in-process, through typer's CliRunner: its help, the checks
it makes before calling, and its client commands against the fake-backed server of
conftest.py (`fake_server`). The CLI's gRPC client blocks, so it runs in a thread while
the server keeps the event loop.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
import typer
from typer.testing import CliRunner, Result

from inferwire import __version__
from inferwire.cli import app
from tests.support.fake_backend import switched

runner = CliRunner()
UNREACHABLE = {"INFERWIRE_ADDRESS": "127.0.0.1:1"}  # never called: the CLI refuses first


async def call(fake_server: Any, *args: str, use_env: bool = True, stdin: str = "") -> Result:
    """Run the CLI against the fake server, addressed by INFERWIRE_ADDRESS or --address."""
    target = f"127.0.0.1:{fake_server[0].port}"
    env = {"INFERWIRE_ADDRESS": target if use_env else None}
    argv = [*args] if use_env else [*args, "--address", target]
    return await asyncio.to_thread(runner.invoke, app, argv, input=stdin, env=env)


def test_version_prints_the_package_version():
    result = runner.invoke(app, ["--version"])
    assert (result.exit_code, result.stdout) == (0, f"inferwire {__version__}\n")


def commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(path, group)]
    for name, command in getattr(group, "commands", {}).items():
        found += commands(command, (*path, name))
    return found


@pytest.mark.parametrize(("path", "command"), commands(typer.main.get_command(app)))
def test_every_option_and_argument_has_help_and_the_help_has_no_placeholders(path, command):
    for param in command.params:
        assert param.help, f"inferwire {' '.join(path)}: {param.name} has no help"
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0
    assert "<bool>" not in result.stdout and "{" not in result.stdout, result.stdout


def test_infer_usage_names_its_arguments_plainly():
    result = runner.invoke(app, ["infer", "--help"], env={"COLUMNS": "120"})
    assert " infer [OPTIONS] MODEL [PROMPT]" in result.stdout


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--max-tokens", "0"),
        ("--temperature", "-0.5"),
        ("--top-p", "0"),
        ("--top-p", "1.5"),
        ("--top-k", "-1"),
        ("--seed", "-1"),
        ("--seed", str(2**32)),
    ],
)
def test_out_of_range_generation_options_are_refused_before_any_call(option, value):
    result = runner.invoke(app, ["infer", "m", "hi", option, value], env=UNREACHABLE)
    assert result.exit_code == 2
    assert f"Invalid value for '{option}'" in result.output


@pytest.mark.parametrize("args", [["m"], ["m", "hi", "--prompt-file", "-"]])
def test_the_prompt_must_be_given_exactly_once(args):
    result = runner.invoke(app, ["infer", *args], env=UNREACHABLE)
    assert result.exit_code == 2
    assert "give the prompt once" in result.output


async def test_client_commands_call_the_server_named_by_inferwire_address(fake_server):
    result = await call(fake_server, "models", "list")
    assert result.exit_code == 0, result.output
    assert [line.split()[0] for line in result.stdout.splitlines()] == ["m", "idle", "tight"]


async def test_invalid_argument_prints_each_violation_once(fake_server):
    result = await call(fake_server, "infer", "m", "", "--stop", "")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "error: INVALID_ARGUMENT: 2 invalid fields",
        "  prompt: must be non-empty (or send messages instead)",
        "  parameters.stop[0]: must be a non-empty string",
    ]


@pytest.mark.parametrize(
    ("args", "code", "hint"),
    [
        (["infer", "idle", "hi"], "FAILED_PRECONDITION", "inferwire models load idle"),
        (["infer", "ghost", "hi"], "NOT_FOUND", "inferwire models list"),
        (["models", "unload", "ghost"], "NOT_FOUND", "inferwire models list"),
    ],
)
@pytest.mark.parametrize("use_env", [True, False])
async def test_a_model_that_cannot_run_gets_the_command_to_run_next(
    fake_server, args, code, hint, use_env
):
    result = await call(fake_server, *args, use_env=use_env)
    assert result.exit_code == 1
    [error, hint_line] = result.stderr.splitlines()
    assert error.startswith(f"error: {code}: ")
    if not use_env:  # the hint calls the same server
        hint += f" --address 127.0.0.1:{fake_server[0].port}"
    assert hint_line == f"hint: {hint}"


USAGE_LINE = re.compile(
    r"finish_reason=STOP prompt_tokens=3 completion_tokens=3 queue_ms=\d+\.\d "
    r"ttft_ms=\d+\.\d total_ms=\d+\.\d request_id=[0-9a-f]{32}\n"
)


@pytest.mark.parametrize("stream", [[], ["--stream"]])
async def test_usage_is_one_line_of_rounded_key_values_unary_and_streamed(fake_server, stream):
    result = await call(fake_server, "infer", "m", "hi", "--usage", *stream)
    assert result.exit_code == 0, result.output
    assert result.stdout == "Hello, world\n"
    assert USAGE_LINE.fullmatch(result.stderr), result.stderr


async def test_the_prompt_comes_verbatim_from_standard_input_or_a_file(fake_server, tmp_path):
    backend = fake_server[1]["m"]
    prompt = "Dear Sir,\n\tthis prompt has lines — and ünïcode.\n"
    assert (await call(fake_server, "infer", "m", "-", stdin=prompt)).exit_code == 0
    assert backend.calls.requests[-1].prompt == prompt
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(prompt * 2, encoding="utf-8")
    result = await call(fake_server, "infer", "m", "--prompt-file", str(prompt_file))
    assert result.exit_code == 0, result.output
    assert backend.calls.requests[-1].prompt == prompt * 2


# Chat, log-probabilities, constraints and tokenize


async def test_infer_chat_sends_the_system_and_chat_messages_in_order(fake_server):
    async with switched(fake_server, "m", chat_template=True) as backend:
        result = await call(
            fake_server, "infer", "m", "--system", "Verona.", "--chat", "user: Hi:there"
        )
    assert result.exit_code == 0, result.output
    assert result.stdout == "Hello, world\n"
    assert backend.calls.requests[-1].prompt == "system: Verona.\nuser: Hi:there\nassistant: "


async def test_infer_logprobs_prints_one_line_per_token_with_its_alternatives(fake_server):
    async with switched(fake_server, "m", supports_logprobs=True) as backend:
        result = await call(fake_server, "infer", "m", "hi", "--logprobs", "2", "--stream")
    assert result.exit_code == 0, result.output
    assert result.stdout == "Hello, world\n"
    assert result.stderr.splitlines() == [
        "  -0.1000      0 'Hello'  top: 'Hello' -0.1000, 'alt1' -1.1000",
        "  -0.2000      1 ','  top: ',' -0.2000, 'alt1' -1.2000",
        "  -0.3000      2 ' world'  top: ' world' -0.3000, 'alt1' -1.3000",
    ]
    params = backend.calls.requests[-1].params
    assert (params.logprobs, params.top_logprobs) == (True, 2)


@pytest.mark.parametrize("kind", ["json_schema", "regex", "lark_grammar"])
async def test_infer_sends_the_constraint_given(fake_server, tmp_path, kind):
    text = '{"type": "object"}' if kind == "json_schema" else "start: /a+/"
    if kind == "regex":
        args = ["--regex", "a+"]
        text = "a+"
    else:
        path = tmp_path / "constraint"
        path.write_text(text)
        args = [f"--{kind.replace('_', '-')}", str(path)]
    async with switched(fake_server, "m", supports_constraints=True) as backend:
        result = await call(fake_server, "infer", "m", "hi", *args)
    assert result.exit_code == 0, result.output
    constraint = backend.calls.requests[-1].params.constraint
    assert constraint is not None
    assert (constraint.kind.value, constraint.text) == (kind, text)


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["infer", "m", "--system", "x"], "needs at least one --chat message"),
        (["infer", "m", "--chat", "no role here"], "has no role"),
        (["infer", "m", "hi", "--chat", "user: x"], "not both"),
        (["infer", "m", "hi", "--regex", "a", "--json-schema", "/dev/null"], "at most one"),
        (["tokenize", "m", "hi", "--chat", "user: x"], "not both"),
    ],
)
def test_chat_and_constraint_options_are_checked_before_any_call(args, complaint):
    result = runner.invoke(app, args, env=UNREACHABLE)
    assert result.exit_code == 2
    assert complaint in result.stderr


async def test_tokenize_prints_the_count_and_the_ids(fake_server):
    result = await call(fake_server, "tokenize", "m", "hé")
    assert result.exit_code == 0, result.output
    assert result.stdout == "count 3\n104 195 169\n"


async def test_tokenize_chat_prints_the_rendered_prompt(fake_server):
    async with switched(fake_server, "m", chat_template=True):
        result = await call(fake_server, "tokenize", "m", "--chat", "user: Hi")
    assert result.exit_code == 0, result.output
    rendered = "user: Hi\nassistant: "
    assert (
        result.stdout
        == f"count {len(rendered)}\n{' '.join(map(str, rendered.encode()))}\n{rendered}"
    )


async def test_chat_refused_for_want_of_a_template_gets_no_load_hint(fake_server):
    result = await call(fake_server, "infer", "m", "--chat", "user: Hi")
    assert result.exit_code == 1
    [error] = result.stderr.splitlines()
    assert error.startswith("error: FAILED_PRECONDITION: model 'm' has no chat template")


async def test_infer_priority_may_lower_the_callers_priority_but_not_raise_it(fake_server):
    lowered = await call(fake_server, "infer", "m", "hi", "--priority", "batch", "--stream")
    assert lowered.exit_code == 0, lowered.output
    assert lowered.stdout == "Hello, world\n"
    raised = await call(fake_server, "infer", "m", "hi", "--priority", "interactive")
    assert raised.exit_code == 1
    assert "PERMISSION_DENIED" in raised.stderr and "priority" in raised.stderr
    assert "anonymous" in raised.stderr


async def test_models_load_sends_the_adapter_source(fake_server, tmp_path):
    # The fake server has no server.adapters.allowed_dirs: its refusal shows the source
    # reached it (a plain load of a configured model succeeds).
    path = tmp_path / "a.onnx_adapter"
    result = await call(
        fake_server, "models", "load", "tuned", "--adapter-of", "m", "--adapter-path", str(path)
    )
    assert result.exit_code == 1
    assert result.stderr.startswith("error: PERMISSION_DENIED: run-time adapter registration")


def test_models_load_adapter_options_go_together():
    result = runner.invoke(app, ["models", "load", "x", "--adapter-of", "m"], env=UNREACHABLE)
    assert result.exit_code == 2
    assert "--adapter-of and --adapter-path go together" in result.output
