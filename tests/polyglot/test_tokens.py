"""Bearer tokens end to end: a real `inferwire serve` with a tokens file, called by the
real CLI (`--token`, `INFERWIRE_TOKEN`) and by grpcurl with `-H 'authorization: Bearer …'`."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
import yaml

from inferwire.core.auth import hash_token, new_token
from tests.support.polyglot import grpcurl, require_tool
from tests.support.process import ServerProcess, run_cli, start_serving_server, stop_server_process

TOKEN = new_token()


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("tokens")
    tokens = [{"name": "polyglot", "sha256": hash_token(TOKEN), "scopes": ["infer"]}]
    (folder / "tokens.yaml").write_text(yaml.safe_dump(tokens))
    config = {"server": {"auth": {"tokens_file": str(folder / "tokens.yaml")}}}
    (folder / "inferwire.yaml").write_text(yaml.safe_dump(config))
    server = start_serving_server("--config", str(folder / "inferwire.yaml"))
    try:
        yield server
    finally:
        stop_server_process(server)


def test_the_cli_sends_its_token_and_is_refused_without_one(secured: ServerProcess) -> None:
    args = ("infer", "demo", "ROMEO:", "--max-tokens", "4", "--address", secured.target)
    refused = run_cli(*args, env={"INFERWIRE_TOKEN": ""})
    assert refused.returncode == 1 and "error: UNAUTHENTICATED" in refused.stderr
    assert run_cli(*args, "--token", TOKEN).returncode == 0
    assert run_cli(*args, "--stream", env={"INFERWIRE_TOKEN": TOKEN}).returncode == 0
    admin = run_cli("models", "unload", "demo", "--token", TOKEN, "--address", secured.target)
    assert admin.returncode == 1 and "PERMISSION_DENIED" in admin.stderr
    assert TOKEN not in "".join(secured.log_lines)


def grpcurl_infer(target: str, *flags: str) -> subprocess.CompletedProcess[str]:
    data = {"model": "demo", "prompt": "ROMEO:", "parameters": {"max_tokens": 4}}
    return grpcurl(
        target, "inferwire.v1.InferenceService/Infer", flags=("-plaintext", *flags), data=data
    )


def test_grpcurl_with_a_bearer_header_is_served(secured: ServerProcess) -> None:
    served = grpcurl_infer(secured.target, "-H", f"authorization: Bearer {TOKEN}")
    assert served.returncode == 0, served.stderr
    assert json.loads(served.stdout)["finishReason"] == "FINISH_REASON_LENGTH"
    refused = grpcurl_infer(secured.target)
    assert refused.returncode != 0 and "Unauthenticated" in refused.stderr, refused.stderr
    listed = subprocess.run(  # reflection stays open: no header needed to list services
        [require_tool("grpcurl"), "-plaintext", secured.target, "list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "inferwire.v1.InferenceService" in listed.stdout, listed.stderr
