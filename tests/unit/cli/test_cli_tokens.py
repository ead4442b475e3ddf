"""`inferwire token new|hash` and the client commands' `--token`, in-process (CliRunner)
against a fake-backed server whose tokens file holds what `token new` printed."""

from __future__ import annotations

import asyncio
import hashlib

import yaml
from typer.testing import CliRunner

from inferwire.cli import app
from inferwire.core.auth import TOKEN_BYTES
from tests.support.auth import start_server

runner = CliRunner()


def test_token_new_prints_a_random_token_once_and_its_entry():
    result = runner.invoke(
        app, ["token", "new", "--name", "batch", "--scope", "infer", "--model", "llama-*"]
    )
    assert result.exit_code == 0, result.output
    token, *entry_lines = result.stdout.splitlines()
    assert len(token) >= TOKEN_BYTES * 4 // 3
    [entry] = yaml.safe_load("\n".join(entry_lines))
    assert entry == {
        "name": "batch",
        "sha256": hashlib.sha256(token.encode()).hexdigest(),
        "scopes": ["infer"],
        "models": ["llama-*"],
    }
    assert token not in "\n".join(entry_lines)
    again = runner.invoke(app, ["token", "new", "--name", "batch", "--scope", "infer"])
    assert again.stdout.splitlines()[0] != token


def test_token_new_names_the_tenant_given():
    result = runner.invoke(
        app, ["token", "new", "--name", "fe", "--scope", "infer", "--tenant", "chat-frontend"]
    )
    assert result.exit_code == 0, result.output
    [entry] = yaml.safe_load("\n".join(result.stdout.splitlines()[1:]))
    assert entry["tenant"] == "chat-frontend"


def test_token_new_refuses_an_unknown_scope():
    result = runner.invoke(app, ["token", "new", "--name", "x", "--scope", "root"])
    assert result.exit_code == 2 and "infer or admin" in result.output


def test_token_hash_prints_the_digest_of_the_token_on_stdin():
    result = runner.invoke(app, ["token", "hash"], input="s3cret\n")
    assert (result.exit_code, result.stdout) == (0, hashlib.sha256(b"s3cret").hexdigest() + "\n")
    assert runner.invoke(app, ["token", "hash"], input="\n").exit_code == 2


async def test_a_token_hashed_with_token_hash_authenticates_the_cli(tmp_path):
    token = runner.invoke(app, ["token", "new", "--name", "x", "--scope", "admin"]).stdout
    token = token.splitlines()[0]
    digest = runner.invoke(app, ["token", "hash"], input=token).stdout.strip()
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump([{"name": "cli", "sha256": digest, "scopes": ["admin"]}]))
    server = await start_server(path)
    target = ["--address", f"127.0.0.1:{server.port}"]

    def invoke(*args: str, env: dict[str, str | None] | None = None):
        return runner.invoke(app, [*args, *target], env={"INFERWIRE_TOKEN": None, **(env or {})})

    try:
        refused = await asyncio.to_thread(invoke, "infer", "m", "hi")
        assert refused.exit_code == 1 and "UNAUTHENTICATED" in refused.output
        assert token not in refused.output
        by_flag = await asyncio.to_thread(invoke, "infer", "m", "hi", "--token", token)
        assert (by_flag.exit_code, by_flag.stdout) == (0, "Hello, world\n")
        by_env = await asyncio.to_thread(invoke, "models", "list", env={"INFERWIRE_TOKEN": token})
        assert by_env.exit_code == 0 and by_env.stdout.startswith("m ")
        for command in (("models", "load", "idle"), ("models", "unload", "idle"), ("health",)):
            result = await asyncio.to_thread(invoke, *command, "--token", token)
            assert result.exit_code == 0, (command, result.output)
        streamed = await asyncio.to_thread(invoke, "infer", "m", "hi", "--stream", "--token", token)
        assert streamed.stdout == "Hello, world\n"
    finally:
        await server.stop(grace_s=0)
