"""Bearer tokens and scopes through the real server assembly over fake backends.

Each server here has its own tokens file in a temporary folder. The matrix calls every
InferenceService RPC as each kind of caller and asserts the exact status code.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferwire.api.reflection import V1, V1ALPHA
from inferwire.core import auth
from inferwire.core.auth import TokenStore
from inferwire.core.errors import ConfigurationError
from inferwire.edge.methods import METHODS
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.auth import bearer, start_server, tokens_yaml
from tests.support.reflection import reflection_stream
from tests.support.waiting import wait_until

Code = grpc.StatusCode
OK = None  # the call succeeds

TOKENS = {
    "reader": ("tok-reader-0123456789", ["infer"], None),
    "ops": ("tok-ops-0123456789", ["admin"], None),
    "elsewhere": ("tok-elsewhere-0123456789", ["admin"], ["other-*"]),
    "m-only": ("tok-m-only-0123456789", ["infer"], ["m"]),
}
UNKNOWN_TOKEN = "tok-nobody-0123456789"


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "tokens.yaml"
    path.write_text(tokens_yaml(TOKENS))
    return path


@pytest.fixture(scope="module", params=[[], ["infer"]], ids=["closed", "anonymous-infer"])
async def anonymous_scopes(request: pytest.FixtureRequest) -> list[str]:
    return request.param


@pytest.fixture(scope="module")
async def channel(tokens_file: Path, anonymous_scopes: list[str]) -> AsyncIterator[Any]:
    server = await start_server(tokens_file, anonymous_scopes=anonymous_scopes)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield channel
    finally:
        await server.stop(grace_s=0)


REQUESTS = {
    "LoadModel": pb.LoadModelRequest(model="idle"),
    "UnloadModel": pb.UnloadModelRequest(model="idle"),
    "Infer": pb.InferRequest(model="m", prompt="hi"),
    "InferStream": pb.InferStreamRequest(model="m", prompt="hi"),
    "Health": pb.HealthRequest(model="m"),
    "ListModels": pb.ListModelsRequest(),
    "Tokenize": pb.TokenizeRequest(model="m", prompt="hi"),
}


async def call(channel: grpc.aio.Channel, rpc: str, token: str | None) -> Any:
    stub = inference_pb2_grpc.InferenceServiceStub(channel)
    if rpc == "InferStream":
        return [m async for m in stub.InferStream(REQUESTS[rpc], metadata=bearer(token))]
    return await getattr(stub, rpc)(REQUESTS[rpc], metadata=bearer(token))


async def code_of(channel: grpc.aio.Channel, rpc: str, token: str | None) -> Code | None:
    try:
        await call(channel, rpc, token)
    except grpc.aio.AioRpcError as error:
        assert token is None or token not in error.details()
        return error.code()
    return OK


ADMIN_RPCS = ("LoadModel", "UnloadModel")
# caller -> {rpc: code}; the `anonymous-infer` server differs only for callers without a token.
MATRIX = {
    "no token": dict.fromkeys(REQUESTS, Code.UNAUTHENTICATED),
    "unknown token": dict.fromkeys(REQUESTS, Code.UNAUTHENTICATED),
    "reader": {rpc: Code.PERMISSION_DENIED if rpc in ADMIN_RPCS else OK for rpc in REQUESTS},
    "ops": dict.fromkeys(REQUESTS, OK),
    "elsewhere": {rpc: OK if rpc == "ListModels" else Code.PERMISSION_DENIED for rpc in REQUESTS},
}
ANONYMOUS_INFER = {rpc: Code.UNAUTHENTICATED if rpc in ADMIN_RPCS else OK for rpc in REQUESTS}
CALLER_TOKEN = {"no token": None, "unknown token": UNKNOWN_TOKEN} | {
    name: TOKENS[name][0] for name in ("reader", "ops", "elsewhere")
}


@pytest.mark.parametrize("rpc", REQUESTS)
@pytest.mark.parametrize("caller", MATRIX)
async def test_every_rpc_gets_the_exact_code_for_each_kind_of_caller(
    channel, anonymous_scopes, caller, rpc
):
    expected = MATRIX[caller][rpc]
    if caller == "no token" and anonymous_scopes:
        expected = ANONYMOUS_INFER[rpc]
    assert await code_of(channel, rpc, CALLER_TOKEN[caller]) == expected


INFERENCE_SERVICE = pb.DESCRIPTOR.services_by_name["InferenceService"]


def test_every_rpc_of_the_service_has_its_facts():
    listed = {name for name in METHODS if name.startswith(f"/{INFERENCE_SERVICE.full_name}/")}
    assert listed == {f"/{INFERENCE_SERVICE.full_name}/{m.name}" for m in INFERENCE_SERVICE.methods}


async def test_refusals_name_the_missing_scope_or_model_never_the_token(channel):
    stub = inference_pb2_grpc.InferenceServiceStub(channel)
    cases = [
        (None, stub.LoadModel(REQUESTS["LoadModel"]), "needs a token with scope admin"),
        (
            TOKENS["reader"][0],
            stub.LoadModel(REQUESTS["LoadModel"], metadata=bearer(TOKENS["reader"][0])),
            "LoadModel needs scope admin; the credentials of 'reader' lack it",
        ),
        (
            TOKENS["elsewhere"][0],
            stub.Infer(REQUESTS["Infer"], metadata=bearer(TOKENS["elsewhere"][0])),
            "the credentials of 'elsewhere' do not cover model 'm'",
        ),
        (
            UNKNOWN_TOKEN,
            stub.Infer(REQUESTS["Infer"], metadata=bearer(UNKNOWN_TOKEN)),
            "the bearer token is not valid",
        ),
    ]
    for token, pending, expected in cases:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await pending
        assert expected in raised.value.details()
        assert token is None or token not in raised.value.details()


async def test_health_and_both_reflection_versions_stay_open_without_a_token(channel):
    check = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert check.status == health_pb2.HealthCheckResponse.SERVING
    for version in (V1, V1ALPHA):
        reflect, request_class = reflection_stream(channel, version)
        [response] = [r async for r in reflect(iter([request_class(list_services="")]))]
        services = {s.name for s in response.list_services_response.service}
        assert INFERENCE_SERVICE.full_name in services, version.full_name


async def test_list_models_and_health_show_only_the_tokens_models(channel):
    stub = inference_pb2_grpc.InferenceServiceStub(channel)
    limited, everything = bearer(TOKENS["m-only"][0]), bearer(TOKENS["ops"][0])
    listed = await stub.ListModels(pb.ListModelsRequest(), metadata=limited)
    assert [m.name for m in listed.models] == ["m"]
    listed = await stub.ListModels(pb.ListModelsRequest(), metadata=everything)
    assert sorted(m.name for m in listed.models) == ["idle", "m"]
    health = await stub.Health(pb.HealthRequest(), metadata=limited)
    assert [m.name for m in health.models] == ["m"]
    elsewhere = bearer(TOKENS["elsewhere"][0])
    assert not (await stub.ListModels(pb.ListModelsRequest(), metadata=elsewhere)).models


async def test_open_services_setting_can_close_health(tmp_path):
    path = tmp_path / "tokens.yaml"
    path.write_text(tokens_yaml(TOKENS))
    server = await start_server(path, open_services=[])
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await health.Check(health_pb2.HealthCheckRequest())
            assert raised.value.code() is Code.UNAUTHENTICATED
            reply = await health.Check(
                health_pb2.HealthCheckRequest(), metadata=bearer(TOKENS["ops"][0])
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(grace_s=0)


async def test_a_changed_tokens_file_takes_effect_without_a_restart(tmp_path):
    path = tmp_path / "tokens.yaml"
    path.write_text(tokens_yaml({"reader": TOKENS["reader"]}))
    server = await start_server(path)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            assert await code_of(channel, "ListModels", TOKENS["ops"][0]) is Code.UNAUTHENTICATED
            path.write_text(tokens_yaml({"ops": TOKENS["ops"]}))  # reader revoked, ops added

            async def switched() -> bool:
                return await code_of(channel, "ListModels", TOKENS["ops"][0]) is OK

            await wait_until(switched, timeout_s=5, interval_s=0.1)
            assert await code_of(channel, "ListModels", TOKENS["reader"][0]) is (
                Code.UNAUTHENTICATED
            )
    finally:
        await server.stop(grace_s=0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_invalid_tokens_file_keeps_the_last_good_tokens_and_logs_one_error(tmp_path, caplog):
    path = tmp_path / "tokens.yaml"
    path.write_text(tokens_yaml({"reader": TOKENS["reader"]}))
    clock = Clock()
    store = TokenStore(path, clock=clock)
    path.write_text("- name: broken\n  sha256: not-hex\n  scopes: [infer]\n")
    for _ in range(3):
        clock.now += 2
        principal = store.authenticate(TOKENS["reader"][0])
        assert principal is not None and principal.name == "reader"
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "sha256" in errors[0].error
    path.write_text(tokens_yaml({"ops": TOKENS["ops"]}))
    clock.now += 2
    assert store.authenticate(TOKENS["reader"][0]) is None
    assert store.authenticate(TOKENS["ops"][0]) is not None


def test_a_kubernetes_secret_swap_of_the_data_symlink_is_seen(tmp_path):
    # A mounted Secret: tokens.yaml -> ..data/tokens.yaml, ..data -> ..<timestamp>/
    first, second = tmp_path / "..2024_01", tmp_path / "..2024_02"
    first.mkdir(), second.mkdir()
    (first / "tokens.yaml").write_text(tokens_yaml({"reader": TOKENS["reader"]}))
    (second / "tokens.yaml").write_text(tokens_yaml({"ops": TOKENS["ops"]}))
    (tmp_path / "..data").symlink_to(first.name)
    (tmp_path / "tokens.yaml").symlink_to("..data/tokens.yaml")
    clock = Clock()
    store = TokenStore(tmp_path / "tokens.yaml", clock=clock)
    assert store.authenticate(TOKENS["reader"][0]) is not None
    (tmp_path / "..data_tmp").symlink_to(second.name)
    (tmp_path / "..data_tmp").replace(tmp_path / "..data")  # the kubelet's atomic swap
    clock.now += 0.5  # checked at most every second
    assert store.authenticate(TOKENS["reader"][0]) is not None
    clock.now += 1
    assert store.authenticate(TOKENS["reader"][0]) is None
    assert store.authenticate(TOKENS["ops"][0]) is not None


def test_digests_are_compared_in_constant_time_against_every_entry(tmp_path, monkeypatch):
    path = tmp_path / "tokens.yaml"
    path.write_text(tokens_yaml(TOKENS))
    store = TokenStore(path)
    compared: list[tuple[str, str]] = []
    real_compare = hmac.compare_digest

    def counting(a: str, b: str) -> bool:
        compared.append((a, b))
        return real_compare(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    principal = store.authenticate(TOKENS["reader"][0])  # the first entry matches
    assert principal is not None and principal.name == "reader"
    assert len(compared) == len(TOKENS)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("- name: a\n  sha256: abc\n  scopes: [infer]\n", "[0].sha256: must be 64 hex digits"),
        (f"- name: a\n  sha256: {'a' * 64}\n  scopes: [root]\n", "[0].scopes: each must be"),
        (f"- name: a\n  sha256: {'a' * 64}\n  scopes: [infer]\n  role: x\n", "role: unknown key"),
        ("name: a\n", "must be a YAML list"),
    ],
)
async def test_an_invalid_tokens_file_is_a_configuration_error_at_start(tmp_path, content, why):
    path = tmp_path / "tokens.yaml"
    path.write_text(content)
    with pytest.raises(ConfigurationError, match=re.escape(why)):
        await start_server(path)


async def test_logs_hold_neither_the_token_nor_the_prompt_and_name_the_principal(channel, caplog):
    caplog.set_level(logging.DEBUG)
    prompt = "a secret prompt 7f3a"
    stub = inference_pb2_grpc.InferenceServiceStub(channel)
    for token in (TOKENS["reader"][0], TOKENS["elsewhere"][0], UNKNOWN_TOKEN):
        request = pb.InferRequest(model="m", prompt=prompt, request_id=f"log-{token[:7]}")
        with contextlib.suppress(grpc.aio.AioRpcError):
            await stub.Infer(request, metadata=bearer(token))
    await asyncio.sleep(0.05)  # the handler writes its record as it returns
    finished = {
        r.request_id: r
        for r in caplog.records
        if r.name == "inferwire.access" and r.getMessage() == "request finished"
    }
    assert finished["log-tok-rea"].principal == "reader"
    assert finished["log-tok-els"].code == "PERMISSION_DENIED"
    assert finished["log-tok-els"].principal == "elsewhere"
    everything = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    for secret in (prompt, *(t for t, _, _ in TOKENS.values()), UNKNOWN_TOKEN, "Bearer"):
        assert secret not in everything
