"""The edge's one call, without a door: who it authenticates, which tenant it runs as, and that it
ends once, however many times a door says it has ended."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from inferwire.config import AuthSettings, GatewaySettings
from inferwire.core.auth import UNRESTRICTED, hash_token
from inferwire.core.errors import (
    BackendInvalidArgumentError,
    FieldViolation,
    InvalidArgumentError,
    PermissionDeniedError,
    UnauthenticatedError,
)
from inferwire.core.requests import Priority
from inferwire.edge.authentication import Authenticator
from inferwire.edge.calls import Call, Method, Reception, current_call
from inferwire.edge.errors import Code
from inferwire.edge.methods import MethodFacts, Operation


class Counted:
    def __init__(self) -> None:
        self.ended: list[tuple[Code, int | None]] = []

    def finished(self, code: Code, status: int | None, elapsed_s: float) -> None:
        self.ended.append((code, status))


def reception(tmp_path: Path | None = None) -> Reception:
    auth = AuthSettings()
    if tmp_path is not None:
        tokens = tmp_path / "tokens.yaml"
        entries = [
            {"name": "gw", "sha256": hash_token("gw-token-0123"), "scopes": ["infer", "gateway"]},
            {
                "name": "app",
                "sha256": hash_token("app-token-0123"),
                "scopes": ["infer"],
                "models": ["m*"],
            },
        ]
        tokens.write_text(yaml.safe_dump(entries))
        auth = AuthSettings(tokens_file=str(tokens))
    from inferwire.edge.tenancy import Tenancy

    objectives = GatewaySettings(objectives={"critical": "interactive"})
    return Reception(Authenticator(auth), Tenancy(objectives), None)


def method(
    series: Counted, operation: Operation = Operation.READ, model_at: str | None = "model"
) -> Method:
    facts = MethodFacts(operation, model_at)
    return Method("POST /v1/x", "POST /v1/x", facts, series, "POST /v1/x")


def test_without_credentials_configured_every_call_is_unrestricted_and_current():
    call = reception().call(method(Counted()), "peer", {})
    call.authenticate()
    assert call.principal is UNRESTRICTED
    assert current_call() is call


def test_a_call_is_authenticated_by_its_token_and_its_models_are_checked_before_any_lookup(
    tmp_path,
):
    desk = reception(tmp_path)
    with pytest.raises(UnauthenticatedError):
        desk.call(method(Counted()), "peer", {}).authenticate()
    call = desk.call(method(Counted()), "peer", {"authorization": "Bearer app-token-0123"})
    call.authenticate()
    call.check_model({"model": "mine"}.get)
    with pytest.raises(PermissionDeniedError):
        call.check_model({"model": "other"}.get)
    assert call.model == "other"  # what its access line names


def test_the_model_is_read_where_the_method_s_facts_say_and_only_a_string_is_checked(tmp_path):
    desk = reception(tmp_path)
    read: list[str] = []

    def field(name: str) -> object:
        read.append(name)
        return {"name": "other", "model": 3}.get(name)

    for model_at, refused in (("name", True), ("model", False), (None, False)):
        headers = {"authorization": "Bearer app-token-0123"}
        call = desk.call(method(Counted(), model_at=model_at), "peer", headers)
        call.authenticate()
        if refused:
            with pytest.raises(PermissionDeniedError):
                call.check_model(field)
        else:
            call.check_model(field)  # 3 is no model name: the door's validation refuses it
    assert read == ["name", "model"]


def test_gateway_headers_count_only_from_a_gateway_principal(tmp_path):
    headers = {
        "x-gateway-inference-fairness-id": "team-a",
        "x-gateway-inference-objective": "critical",
    }
    desk = reception(tmp_path)
    gateway = desk.call(
        method(Counted()), "p", {"authorization": "Bearer gw-token-0123", **headers}
    )
    gateway.authenticate()
    assert (gateway.tenant, gateway.priority_hint) == ("team-a", Priority.INTERACTIVE)
    app = desk.call(method(Counted()), "p", {"authorization": "Bearer app-token-0123", **headers})
    app.authenticate()
    assert (app.tenant, app.priority_hint) == ("app", None)


def test_a_call_ends_once_in_its_series():
    series = Counted()
    call: Call = reception().call(method(series, Operation.PROBE), "peer", {})
    call.finish(Code.CANCELLED, status=499)
    call.finish(Code.OK, status=200)  # the stream's own end, after the client left
    assert series.ended == [(Code.CANCELLED, 499)]


def test_a_call_names_the_core_s_violations_as_its_request_does_once_told_how():
    call = reception().call(method(Counted()), "peer", {})
    core = InvalidArgumentError([FieldViolation("parameters.max_tokens", "must be > 0")])
    assert [v.field for v in call.error_reply(core).violations] == ["parameters.max_tokens"]
    call.name_fields(lambda field: field.removeprefix("parameters."))
    reply = call.error_reply(core)
    assert [v.field for v in reply.violations] == ["max_tokens"]
    assert reply.message == "max_tokens: must be > 0"


def test_renaming_violations_keeps_a_backend_refusal_and_its_message():
    refusal = BackendInvalidArgumentError("guided_decoding: lookarounds are not supported")
    assert refusal.renamed(lambda field: "x") is refusal
    assert str(refusal.renamed(lambda field: "x")) == str(refusal)
    core = InvalidArgumentError([FieldViolation("parameters.max_tokens", "must be > 0")])
    named = core.renamed(lambda field: field.removeprefix("parameters."))
    assert [v.field for v in named.violations] == ["max_tokens"]
