"""Adapter models over gRPC, through the real server assembly over fake backends: a
configured adapter on its base, the lifecycle rules between them, and run-time
registration with its security checks (each its exact code, nothing half-registered)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from inferwire.backends import backend_class
from inferwire.config import load_settings
from inferwire.core.errors import ConfigurationError
from inferwire.core.memory import Footprint
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.auth import bearer, tokens_yaml
from tests.support.fake_backend import FAKE_BACKEND, FakeBackends

Served = tuple[InferwireServer, FakeBackends, inference_pb2_grpc.InferenceServiceStub, Path]


def adapter_file(folder: Path, name: str, tag: str) -> Path:
    path = folder / name
    path.write_text(f"FAKE-ADAPTER {tag}\n")
    return path


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    allowed = tmp_path / "adapters"
    allowed.mkdir()
    configured = adapter_file(allowed, "sonnets.adapter", "S")
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(
        tokens_yaml(
            {"ops": ("ops-token", ["admin", "infer"], None), "app": ("app", ["infer"], None)}
        )
    )
    settings = load_settings(
        server={
            "address": "127.0.0.1:0",
            "metrics_address": "",
            "health_check_interval_s": 3600,
            "adapters": {"allowed_dirs": [str(allowed)]},
            "auth": {"tokens_file": str(tokens)},
        },
        models=[
            {"name": "base", "backend": FAKE_BACKEND, "load_on_startup": True},
            {"name": "sonnets", "adapter_of": "base", "options": {"adapter_file": str(configured)}},
            {"name": "lazy", "backend": FAKE_BACKEND, "on_demand": True},
            {
                "name": "lazy-tuned",
                "adapter_of": "lazy",
                "options": {"adapter_file": str(configured)},
            },
        ],
    )
    backends = FakeBackends()
    server = InferwireServer(settings, backend_factory=backends)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield server, backends, inference_pb2_grpc.InferenceServiceStub(channel), allowed
    finally:
        await server.stop(grace_s=0)


ADMIN = bearer("ops-token")


async def infer(stub: Any, model: str) -> str:
    response = await stub.Infer(pb.InferRequest(model=model, prompt="hi"), metadata=ADMIN)
    return str(response.text)


async def load(stub: Any, model: str, source: pb.AdapterSource | None = None) -> pb.ModelStatus:
    request = pb.LoadModelRequest(model=model, adapter=source)
    return (await stub.LoadModel(request, metadata=ADMIN)).model


async def listed(stub: Any) -> dict[str, pb.ModelStatus]:
    response = await stub.ListModels(pb.ListModelsRequest(), metadata=ADMIN)
    return {s.name: s for s in response.models}


async def code_of(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code(), caught.value.details() or ""


async def test_an_adapter_model_is_a_model_on_its_base(served: Served) -> None:
    _, _, stub, _ = served
    assert (await load(stub, "sonnets")).state == pb.MODEL_STATE_READY
    statuses = await listed(stub)
    assert statuses["sonnets"].base_model == "base" and statuses["base"].base_model == ""
    assert statuses["sonnets"].backend == FAKE_BACKEND
    assert await infer(stub, "sonnets") == "S:HelloS:,S: world"
    assert await infer(stub, "base") == "Hello, world"


async def test_an_adapter_needs_its_base_ready_or_loads_an_on_demand_one(served: Served) -> None:
    _, _, stub, _ = served
    await stub.UnloadModel(pb.UnloadModelRequest(model="base"), metadata=ADMIN)
    code, details = await code_of(load(stub, "sonnets"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "'base'" in details
    # An on-demand base is loaded by its adapter's load.
    assert (await load(stub, "lazy-tuned")).state == pb.MODEL_STATE_READY
    assert (await listed(stub))["lazy"].state == pb.MODEL_STATE_READY


async def test_a_base_with_adapters_loaded_is_not_unloaded(served: Served) -> None:
    _, _, stub, _ = served
    await load(stub, "sonnets")
    code, details = await code_of(
        stub.UnloadModel(pb.UnloadModelRequest(model="base"), metadata=ADMIN)
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "sonnets" in details
    assert await infer(stub, "base") == "Hello, world"
    await stub.UnloadModel(pb.UnloadModelRequest(model="sonnets"), metadata=ADMIN)
    await stub.UnloadModel(pb.UnloadModelRequest(model="base"), metadata=ADMIN)
    assert (await listed(stub))["base"].state == pb.MODEL_STATE_UNLOADED


async def test_unloading_an_adapter_drains_its_streams_and_leaves_the_base(served: Served) -> None:
    _, backends, stub, _ = served
    await load(stub, "sonnets")
    gate = backends["base"].generation_gate
    gate.close()
    streams = [
        stub.InferStream(pb.InferStreamRequest(model="sonnets", prompt="hi"), metadata=ADMIN)
        for _ in range(3)
    ]
    while backends["base"].calls.requests.__len__() < 3:
        await asyncio.sleep(0.01)
    unload = asyncio.ensure_future(
        stub.UnloadModel(pb.UnloadModelRequest(model="sonnets"), metadata=ADMIN)
    )
    while (await listed(stub))["sonnets"].state != pb.MODEL_STATE_UNLOADING:
        await asyncio.sleep(0.01)
    code, _ = await code_of(infer(stub, "sonnets"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    gate.open()  # the base serves meanwhile, and the adapter's streams finish
    assert await infer(stub, "base") == "Hello, world"
    for stream in streams:
        assert "".join([m.text async for m in stream]) == "S:HelloS:,S: world"
    assert (await unload).model.state == pb.MODEL_STATE_UNLOADED
    code, _ = await code_of(infer(stub, "sonnets"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert await infer(stub, "base") == "Hello, world"


async def test_an_admin_registers_an_adapter_at_run_time(served: Served) -> None:
    _, _, stub, allowed = served
    path = adapter_file(allowed, "legal.adapter", "L")
    source = pb.AdapterSource(base_model="base", path=str(path))
    status = await load(stub, "legal", source)
    assert status.state == pb.MODEL_STATE_READY and status.base_model == "base"
    assert await infer(stub, "legal") == "L:HelloL:,L: world"
    # The same source again: idempotent.
    assert (await load(stub, "legal", source)).state == pb.MODEL_STATE_READY
    other = pb.AdapterSource(base_model="base", path=str(adapter_file(allowed, "x", "X")))
    code, details = await code_of(load(stub, "legal", other))
    assert code == grpc.StatusCode.ALREADY_EXISTS and "'legal'" in details
    code, _ = await code_of(load(stub, "sonnets", other))  # a configured adapter's name
    assert code == grpc.StatusCode.ALREADY_EXISTS
    # A registered adapter lives until it is unloaded.
    await stub.UnloadModel(pb.UnloadModelRequest(model="legal"), metadata=ADMIN)
    assert "legal" not in await listed(stub)
    code, _ = await code_of(infer(stub, "legal"))
    assert code == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("case", "code", "phrase"),
    [
        ("dot-dot escape", grpc.StatusCode.PERMISSION_DENIED, "allowed_dirs"),
        ("symlink out", grpc.StatusCode.PERMISSION_DENIED, "allowed_dirs"),
        ("missing file", grpc.StatusCode.FAILED_PRECONDITION, "does not exist"),
        ("corrupt file", grpc.StatusCode.FAILED_PRECONDITION, "corrupt"),
        ("unknown base", grpc.StatusCode.NOT_FOUND, "'nope'"),
        ("adapter as base", grpc.StatusCode.INVALID_ARGUMENT, "adapter model"),
        ("non-admin token", grpc.StatusCode.PERMISSION_DENIED, "admin"),
    ],
)
async def test_a_refused_registration_leaves_nothing_behind(
    served: Served, case: str, code: grpc.StatusCode, phrase: str
) -> None:
    _, _, stub, allowed = served
    outside = adapter_file(allowed.parent, "outside.adapter", "O")
    base, metadata = "base", ADMIN
    if case == "dot-dot escape":
        path = f"{allowed}/../outside.adapter"
    elif case == "symlink out":
        (allowed / "link.adapter").symlink_to(outside)
        path = str(allowed / "link.adapter")
    elif case == "missing file":
        path = str(allowed / "missing.adapter")
    elif case == "corrupt file":
        (allowed / "corrupt.adapter").write_bytes(b"\x00not an adapter")
        path = str(allowed / "corrupt.adapter")
    else:
        path = str(adapter_file(allowed, "fine.adapter", "F"))
        base = {"unknown base": "nope", "adapter as base": "sonnets"}.get(case, "base")
        metadata = bearer("app") if case == "non-admin token" else ADMIN
    request = pb.LoadModelRequest(model="new", adapter=pb.AdapterSource(base_model=base, path=path))
    got, details = await code_of(stub.LoadModel(request, metadata=metadata))
    assert (got, phrase in details) == (code, True), details
    assert "new" not in await listed(stub)
    assert await infer(stub, "base") == "Hello, world"  # the server keeps serving


async def test_registration_is_off_without_allowed_dirs(tmp_path: Path) -> None:
    settings = load_settings(
        server={"address": "127.0.0.1:0", "metrics_address": "", "health_check_interval_s": 3600},
        models=[{"name": "base", "backend": FAKE_BACKEND, "load_on_startup": True}],
    )
    server = InferwireServer(settings, backend_factory=FakeBackends())
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            path = adapter_file(tmp_path, "a.adapter", "A")
            source = pb.AdapterSource(base_model="base", path=str(path))
            code, details = await code_of(
                stub.LoadModel(pb.LoadModelRequest(model="a", adapter=source))
            )
            assert code == grpc.StatusCode.PERMISSION_DENIED and "allowed_dirs is empty" in details
    finally:
        await server.stop(grace_s=0)


@pytest.mark.parametrize(
    ("models", "phrase"),
    [
        ([{"name": "a", "adapter_of": "b"}], "adapter_of names 'b', which is not a configured"),
        (
            [
                {"name": "b", "backend": FAKE_BACKEND},
                {"name": "a", "adapter_of": "b"},
                {"name": "c", "adapter_of": "a"},
            ],
            "itself an adapter model",
        ),
        (
            [
                {"name": "b", "backend": FAKE_BACKEND},
                {"name": "a", "adapter_of": "b", "backend": "triton"},
            ],
            "runs on its base's backend",
        ),
        (
            [{"name": "b"}, {"name": "a", "adapter_of": "b", "options": {"lora_name": "x"}}],
            "adapter_file",
        ),
    ],
)
def test_adapter_configuration_mistakes_are_start_up_errors(
    models: list[dict[str, Any]], phrase: str
) -> None:
    with pytest.raises(ConfigurationError, match=phrase):
        load_settings(models=models, backends=backend_class)


async def test_concurrent_streams_over_a_base_and_two_adapters_each_equal_their_solo_run(
    served: Served,
) -> None:
    _, _, stub, allowed = served
    await load(stub, "sonnets")
    source = pb.AdapterSource(base_model="base", path=str(adapter_file(allowed, "b", "B")))
    await load(stub, "second", source)

    async def streamed(model: str) -> str:
        request = pb.InferStreamRequest(model=model, prompt="hi")
        return "".join([m.text async for m in stub.InferStream(request, metadata=ADMIN)])

    models = ["base", "sonnets", "second"]
    solo = {model: await streamed(model) for model in models}
    assert len(set(solo.values())) == 3
    mixed = [models[i % 3] for i in range(8)]
    assert await asyncio.gather(*(streamed(m) for m in mixed)) == [solo[m] for m in mixed]


async def test_an_adapter_counts_against_its_bases_budget_which_is_not_evicted_under_it(
    tmp_path: Path,
) -> None:
    mib = 1 << 20
    path = tmp_path / "big.adapter"
    path.write_bytes(b"FAKE-ADAPTER B\n" + b" " * (50 * mib))
    settings = load_settings(
        server={
            "address": "127.0.0.1:0",
            "metrics_address": "",
            "health_check_interval_s": 3600,
            "memory": {"budgets": {"cpu": "200MiB"}, "min_resident_s": 0},
        },
        models=[
            {"name": "base", "backend": FAKE_BACKEND, "load_on_startup": True},
            {
                "name": "tuned",
                "adapter_of": "base",
                "pinned": True,
                "options": {"adapter_file": str(path)},
            },
            {"name": "other", "backend": FAKE_BACKEND},
        ],
    )

    class SizedFakes(FakeBackends):
        def __call__(self, spec: Any) -> Any:
            backend = super().__call__(spec)
            backend.footprint_ = Footprint("cpu", 80 * mib, detail="as faked")
            return backend

    server = InferwireServer(settings, backend_factory=SizedFakes())
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            tuned = (await stub.LoadModel(pb.LoadModelRequest(model="tuned"))).model
            assert tuned.resident_bytes == path.stat().st_size
            # 80 MiB + 50 MiB held; `other` needs 80 MiB more: only evicting `base` would
            # make room (`tuned` is pinned), and its adapter runs on it.
            code, details = await code_of(stub.LoadModel(pb.LoadModelRequest(model="other")))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "adapters loaded: tuned" in details
            await stub.UnloadModel(pb.UnloadModelRequest(model="tuned"))  # frees its 50 MiB
            loaded = await stub.LoadModel(pb.LoadModelRequest(model="other"))
            assert loaded.model.state == pb.MODEL_STATE_READY and list(loaded.evicted) == []
    finally:
        await server.stop(grace_s=0)
