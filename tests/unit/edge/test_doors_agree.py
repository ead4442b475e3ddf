"""Both doors go through the edge's one call and its one table of method facts, so they
answer alike where they had drifted: the inference gateway's headers set the tenant from a
gateway principal on gRPC (both services) as on HTTP; a model the caller may not see is
refused the same whether it exists or not; HTTP refusals are counted as gRPC's are; each
operation's methods need the same scope on both doors; an inference method's access line
says `request finished` on both, refused or not; the core's refusal of a field names the
field each door's caller sent; a body the HTTP door cannot read is its row of the edge's
error table; and the model list is kept, and current, alike."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from tritonclient.grpc import service_pb2 as oip
from tritonclient.grpc import service_pb2_grpc

from inferwire.config import load_settings
from inferwire.core.auth import Principal, Scope, hash_token
from inferwire.edge.errors import (
    CODE_BY_ERROR,
    BodyTimeoutError,
    BodyTooLargeError,
    MalformedRequestError,
    UnsupportedMediaTypeError,
    error_reply,
)
from inferwire.edge.methods import METHODS, Operation
from inferwire.http.errors import http_answer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.fake_backend import FAKE_BACKEND, serving_fakes, switched
from tests.support.oip import kserve_request
from tests.support.status import bad_request_fields
from tests.support.waiting import wait_until

TOKENS = {
    "gateway": "iwt_gateway_0123",
    "plain": "iwt_plain_0123",
    "narrow": "iwt_narrow_0123",
    "reader": "iwt_reader_0123",
    "speaker": "iwt_speaker_0123",
}
GATEWAY_HEADERS = {
    "x-gateway-inference-fairness-id": "team-a",
    "x-gateway-inference-objective": "critical",
}


def settings(tmp_path: Path, **server: Any) -> Any:
    entries = [
        {
            "name": "gateway",
            "sha256": hash_token(TOKENS["gateway"]),
            "scopes": ["infer", "gateway"],
        },
        {"name": "plain", "sha256": hash_token(TOKENS["plain"]), "scopes": ["admin"]},
        {"name": "reader", "sha256": hash_token(TOKENS["reader"]), "scopes": ["infer"]},
        # Speaks for others, and may do nothing itself.
        {"name": "speaker", "sha256": hash_token(TOKENS["speaker"]), "scopes": ["gateway"]},
        # Restricted to `open-*`: `secret` exists, `nowhere` does not; both are out of reach.
        {
            "name": "narrow",
            "sha256": hash_token(TOKENS["narrow"]),
            "scopes": ["admin"],
            "models": ["open-*"],
        },
    ]
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump(entries))
    return load_settings(
        server={
            "address": "127.0.0.1:0",
            "health_check_interval_s": 3600,
            "tenants": [{"name": "team-a", "priority": "interactive"}],
            "auth": {"tokens_file": str(tokens)},
            **server,
        },
        models=[
            {"name": "m", "backend": FAKE_BACKEND, "load_on_startup": True},
            {"name": "secret", "backend": FAKE_BACKEND, "load_on_startup": True},
            {"name": "open-one", "backend": FAKE_BACKEND, "load_on_startup": True},
        ],
    )


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[token]}"),)


async def test_gateway_headers_set_the_tenant_on_every_door_from_a_gateway_principal_only(
    tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="inferwire.access")
    async with serving_fakes(settings(tmp_path)) as (server, _):
        target = f"127.0.0.1:{server.port}"
        async with grpc.aio.insecure_channel(target) as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            kserve = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            for token in ("gateway", "plain"):
                metadata = (*bearer(token), *GATEWAY_HEADERS.items())
                await stub.Infer(
                    pb.InferRequest(model="m", prompt="hi", request_id=f"{token}-infer"),
                    metadata=metadata,
                )
                stream = stub.InferStream(
                    pb.InferStreamRequest(model="m", prompt="hi", request_id=f"{token}-stream"),
                    metadata=metadata,
                )
                assert [m async for m in stream]
                await kserve.ModelInfer(
                    kserve_request("hi", model="m", id=f"{token}-kserve"), metadata=metadata
                )
        async with httpx.AsyncClient(
            base_url=f"http://{target.split(':')[0]}:{server.http_port}"
        ) as client:
            for token in ("gateway", "plain"):
                reply = await client.post(
                    "/v1/completions",
                    json={"model": "m", "prompt": "hi"},
                    headers={
                        "authorization": f"Bearer {TOKENS[token]}",
                        "x-request-id": f"{token}-http",
                        **GATEWAY_HEADERS,
                    },
                )
                assert reply.status_code == 200, reply.text

        def lines() -> dict[str, Any]:
            return {r.request_id: r for r in caplog.records if hasattr(r, "tenant")}

        async def all_written() -> bool:
            return "plain-http" in lines()

        await wait_until(all_written)
    found = lines()
    for door in ("infer", "stream", "kserve", "http"):
        gateway, plain = found[f"gateway-{door}"], found[f"plain-{door}"]
        assert (gateway.tenant, gateway.priority) == ("team-a", "interactive"), door
        assert (plain.tenant, plain.priority) == ("plain", "standard"), door


async def test_a_model_out_of_reach_is_refused_alike_whether_it_exists_or_not(tmp_path):
    async with serving_fakes(settings(tmp_path)) as (server, _):
        refusals: dict[str, list[Any]] = {"secret": [], "nowhere": []}
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            kserve = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            for name, seen in refusals.items():
                for call in (
                    stub.Health(pb.HealthRequest(model=name), metadata=bearer("narrow")),
                    stub.LoadModel(pb.LoadModelRequest(model=name), metadata=bearer("narrow")),
                    kserve.ModelMetadata(
                        oip.ModelMetadataRequest(name=name), metadata=bearer("narrow")
                    ),
                ):
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await call
                    seen.append(refused.value.code())
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            headers = {"authorization": f"Bearer {TOKENS['narrow']}"}
            for name, seen in refusals.items():
                model = await client.get(f"/v1/models/{name}", headers=headers)
                completion = await client.post(
                    "/v1/completions", json={"model": name, "prompt": "hi"}, headers=headers
                )
                seen += [model.status_code, completion.status_code]
                seen.append(model.json()["error"]["code"])
    assert refusals["secret"] == refusals["nowhere"]
    assert refusals["secret"] == [grpc.StatusCode.PERMISSION_DENIED] * 3 + [
        403,
        403,
        "permission_denied",
    ]


def http_requests(server: Any, handler: str, status: int) -> float:
    value = server.metrics.registry.get_sample_value(
        "http_requests_total", {"method": "POST", "handler": handler, "status": str(status)}
    )
    return value or 0.0


async def test_http_refusals_are_counted_by_route_and_status_as_grpc_s_are(tmp_path):
    async with serving_fakes(settings(tmp_path)) as (server, _):
        assert http_requests(server, "/v1/completions", 200) == 0  # there from the start
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            good = {"authorization": f"Bearer {TOKENS['plain']}"}
            cases = [
                ({}, {"model": "m", "prompt": "hi"}, 401),
                (good, {"model": "m", "prompt": "hi", "n": 2}, 400),
                (good, {"model": "ghost", "prompt": "hi"}, 404),
                (good, {"model": "m", "prompt": "hi"}, 200),
            ]
            for headers, body, status in cases:
                reply = await client.post("/v1/completions", json=body, headers=headers)
                assert reply.status_code == status, reply.text
        for _, _, status in cases:
            assert http_requests(server, "/v1/completions", status) == 1, status
        duration = server.metrics.registry.get_sample_value(
            "http_request_duration_seconds_count",
            {"method": "POST", "handler": "/v1/completions"},
        )
        assert duration == len(cases)


def grpc_calls(channel: grpc.aio.Channel) -> dict[str, Any]:
    """A call of one method of each kind on gRPC, by its name in edge/methods.py: each
    takes the call's metadata and raises AioRpcError when refused."""
    stub = inference_pb2_grpc.InferenceServiceStub(channel)
    kserve = service_pb2_grpc.GRPCInferenceServiceStub(channel)

    async def stream(metadata: Any) -> None:
        request = pb.InferStreamRequest(model="m", prompt="hi")
        assert [m async for m in stub.InferStream(request, metadata=metadata)]

    v1, oip_ = "/inferwire.v1.InferenceService/", "/inference.GRPCInferenceService/"
    return {
        v1 + "Infer": lambda m: stub.Infer(pb.InferRequest(model="m", prompt="hi"), metadata=m),
        v1 + "InferStream": stream,
        v1 + "Tokenize": lambda m: stub.Tokenize(
            pb.TokenizeRequest(model="m", prompt="hi"), metadata=m
        ),
        v1 + "Embed": lambda m: stub.Embed(
            pb.EmbedRequest(model="open-one", inputs=["hi"]), metadata=m
        ),
        v1 + "Rerank": lambda m: stub.Rerank(
            pb.RerankRequest(model="open-one", query="hi", documents=["a", "b"]), metadata=m
        ),
        v1 + "ListModels": lambda m: stub.ListModels(pb.ListModelsRequest(), metadata=m),
        v1 + "Health": lambda m: stub.Health(pb.HealthRequest(model="m"), metadata=m),
        v1 + "LoadModel": lambda m: stub.LoadModel(pb.LoadModelRequest(model="m"), metadata=m),
        oip_ + "ModelInfer": lambda m: kserve.ModelInfer(
            kserve_request("hi", model="m"), metadata=m
        ),
        oip_ + "ModelMetadata": lambda m: kserve.ModelMetadata(
            oip.ModelMetadataRequest(name="m"), metadata=m
        ),
        oip_ + "ServerMetadata": lambda m: kserve.ServerMetadata(
            oip.ServerMetadataRequest(), metadata=m
        ),
        oip_ + "RepositoryIndex": lambda m: kserve.RepositoryIndex(
            oip.RepositoryIndexRequest(), metadata=m
        ),
        oip_ + "ServerLive": lambda m: kserve.ServerLive(oip.ServerLiveRequest(), metadata=m),
    }


HTTP_CALLS: dict[str, Any] = {
    "POST /v1/completions": {"model": "m", "prompt": "hi"},
    "POST /v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "POST /v1/responses": {"model": "m", "input": "hi", "store": False},
    "POST /v1/messages": {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
    },
    "POST /v1/messages/count_tokens": {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
    },
    "POST /v1/embeddings": {"model": "open-one", "input": "hi"},
    "POST /v1/rerank": {"model": "open-one", "query": "hi", "documents": ["a"]},
    "POST /v2/rerank": {"model": "open-one", "query": "hi", "documents": ["a"]},
    "POST /v1/completions/render": {"model": "m", "prompt": "hi"},
    "POST /v1/chat/completions/render": {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
    },
    "POST /tokenize": {"model": "m", "prompt": "hi"},
    "POST /detokenize": {"model": "m", "tokens": [1]},
    "GET /v1/models": None,
    "GET /v1/models/{model}": None,
    "GET /v1/responses/{response_id}": None,
    "GET /health": None,
    "GET /version": None,
}


async def test_equivalent_methods_need_the_same_scope_on_both_doors(tmp_path):
    """Each operation's methods answer each caller alike, on either door: what a caller
    may do is the operation's (edge/methods.py), not a door's."""
    codes: dict[str, dict[Operation, set[str]]] = {}
    async with (
        serving_fakes(settings(tmp_path)) as served,
        switched(served, "m", chat_template=True),
        switched(served, "open-one", embeds=True),
    ):
        server = served[0]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            calls = grpc_calls(channel)
            for caller in (None, "speaker", "reader", "plain"):
                seen = codes.setdefault(str(caller), {})
                for name, send in calls.items():
                    try:
                        await send(bearer(caller) if caller else ())
                        code = "ok"
                    except grpc.aio.AioRpcError as refused:
                        code = refused.code().name.lower()
                    seen.setdefault(METHODS[name].operation, set()).add(code)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            for caller in (None, "speaker", "reader", "plain"):
                headers = {"authorization": f"Bearer {TOKENS[caller]}"} if caller else {}
                seen = codes[str(caller)]
                for name, body in HTTP_CALLS.items():
                    method, path = name.split(" ")
                    path = path.format(model="m", response_id="resp_none")
                    reply = await client.request(method, path, json=body, headers=headers)
                    code = "ok" if reply.status_code < 400 else error_code(reply.json())
                    seen.setdefault(METHODS[name].operation, set()).add(code)
    for caller, by_operation in codes.items():
        for operation, seen in by_operation.items():
            assert seen == {expected(caller, operation)}, (caller, operation)


# Anthropic's error types (http/anthropic/errors.py) of the codes these calls end with.
ANTHROPIC_CODES = {
    "authentication_error": "unauthenticated",
    "permission_error": "permission_denied",
    "not_found_error": "not_found",
}


def error_code(body: dict[str, Any]) -> str:
    """The code of an error body: OpenAI's says it, Anthropic's by its type."""
    error = body["error"]
    return error["code"] if "code" in error else ANTHROPIC_CODES[error["type"]]


CALLER_SCOPES = {"speaker": {"gateway"}, "reader": {"infer"}, "plain": {"admin"}}


def expected(caller: str, operation: Operation) -> str:
    """What `caller` gets from any method of `operation`, by the operation's scope."""
    scope = operation.scope
    if scope is None:
        return "ok"
    if caller == "None":
        return "unauthenticated"
    principal = Principal(caller, frozenset(Scope(s) for s in CALLER_SCOPES[caller]))
    if not principal.has_scope(scope):
        return "permission_denied"
    return "not_found" if operation is Operation.STORED else "ok"  # no such response


async def test_an_inference_method_s_access_line_says_request_finished_on_both_doors(
    tmp_path, caplog
):
    """Whether the core saw it or the call was refused first, an inference method's line
    says `request finished`, and any other method's `rpc finished`, on either door."""
    caplog.set_level(logging.INFO, logger="inferwire.access")
    async with serving_fakes(settings(tmp_path)) as (server, _):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            calls = grpc_calls(channel)
            for name in (
                "/inferwire.v1.InferenceService/Infer",
                "/inference.GRPCInferenceService/ModelInfer",
                "/inferwire.v1.InferenceService/ListModels",
            ):
                for metadata in (bearer("plain"), ()):  # served, then refused (no token)
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await calls[name](metadata)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            for name in (
                "POST /v1/completions",
                "POST /v1/responses",
                "POST /v1/messages",
                "GET /v1/models",
            ):
                method, path = name.split(" ")
                for headers in ({"authorization": f"Bearer {TOKENS['plain']}"}, {}):
                    await client.request(method, path, json=HTTP_CALLS[name], headers=headers)
    lines: dict[str, set[tuple[str, str]]] = {}
    for record in caplog.records:
        if record.name == "inferwire.access":
            lines.setdefault(record.method, set()).add((record.code, record.getMessage()))
    for name, seen in lines.items():
        said = "request finished" if METHODS[name].inference else "rpc finished"
        assert {message for _, message in seen} == {said}, name
        assert "UNAUTHENTICATED" in {code for code, _ in seen}, name
    assert len(lines) == 7


async def test_the_core_s_refusal_of_a_field_names_the_field_each_door_s_caller_sent(
    tmp_path,
):
    """A core field violation (`parameters.temperature`) comes back named as the caller
    sent it, on every inference method of both doors, unary or streamed."""
    named: dict[str, str] = {}
    async with (
        serving_fakes(settings(tmp_path)) as served,
        switched(served, "m", chat_template=True),
    ):
        server, metadata = served[0], bearer("plain")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            kserve = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            hot = pb.GenerationParameters(temperature=-1)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Infer(
                    pb.InferRequest(model="m", prompt="hi", parameters=hot), metadata=metadata
                )
            named["Infer"] = bad_request_fields(refused.value)[0]
            stream = stub.InferStream(
                pb.InferStreamRequest(model="m", prompt="hi", parameters=hot), metadata=metadata
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                [m async for m in stream]
            named["InferStream"] = bad_request_fields(refused.value)[0]
            asked = kserve_request("hi", {"temperature": -1}, model="m")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await kserve.ModelInfer(asked, metadata=metadata)
            named["ModelInfer"] = bad_request_fields(refused.value)[0]

            async def one(request: Any) -> Any:
                yield request

            replies = kserve.ModelStreamInfer(one(asked), metadata=metadata)
            (answer,) = [r async for r in replies]
            named["ModelStreamInfer"] = answer.error_message.split(":")[0]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            headers = {"authorization": f"Bearer {TOKENS['plain']}"}
            for name in ("POST /v1/completions", "POST /v1/chat/completions", "POST /v1/responses"):
                for stream_ in (False, True):
                    body = {**HTTP_CALLS[name], "temperature": -1.0, "stream": stream_}
                    reply = await client.post(name.split(" ")[1], json=body, headers=headers)
                    assert reply.status_code == 400, reply.text
                    named[f"{name} stream={stream_}"] = reply.json()["error"]["param"]
    assert named == {
        "Infer": "parameters.temperature",
        "InferStream": "parameters.temperature",
        "ModelInfer": "sampling_parameters.temperature",
        "ModelStreamInfer": "sampling_parameters.temperature",
    } | {
        f"POST {path} stream={stream}": "temperature"
        for path in ("/v1/completions", "/v1/chat/completions", "/v1/responses")
        for stream in (False, True)
    }


async def test_an_embedding_refusal_names_the_field_each_door_s_caller_sent(tmp_path):
    """The core's `inputs[1]` is `input[1]` in OpenAI's body (`input` when it was one
    string), a document given as an object is `documents[i].text`; gRPC names its own."""
    named: dict[str, list[str]] = {}
    async with (
        serving_fakes(settings(tmp_path)) as served,
        switched(served, "open-one", embeds=True),
    ):
        server, metadata = served[0], bearer("plain")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            for name, call in (
                (
                    "Embed",
                    stub.Embed(
                        pb.EmbedRequest(model="open-one", inputs=["ok", ""]), metadata=metadata
                    ),
                ),
                (
                    "Rerank",
                    stub.Rerank(
                        pb.RerankRequest(model="open-one", query="q", documents=["", "d"]),
                        metadata=metadata,
                    ),
                ),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call
                assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                named[name] = bad_request_fields(refused.value)
        headers = {"authorization": f"Bearer {TOKENS['plain']}"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            for name, path, body in (
                ("list", "/v1/embeddings", {"model": "open-one", "input": ["ok", ""]}),
                ("one", "/v1/embeddings", {"model": "open-one", "input": ""}),
                ("ids", "/v1/embeddings", {"model": "open-one", "input": [[1], []]}),
                ("v1", "/v1/rerank", {"model": "open-one", "query": "q", "documents": ["", "d"]}),
                (
                    "v2",
                    "/v2/rerank",
                    {"model": "open-one", "query": "", "documents": [{"text": ""}]},
                ),
            ):
                reply = await client.post(path, json=body, headers=headers)
                assert reply.status_code == 400, reply.text
                named[name] = [reply.json()["error"]["param"]]
    assert named == {
        "Embed": ["inputs[1]"],
        "Rerank": ["documents[0]"],
        "list": ["input[1]"],
        "one": ["input"],
        "ids": ["input[1]"],
        "v1": ["documents[0]"],
        "v2": ["query"],
    }


async def test_a_body_the_http_door_cannot_read_is_answered_through_the_edge_s_table(tmp_path):
    """A body too large, of the wrong type, not JSON or too slow is its kind's row of the
    edge's one table, with HTTP's own status for it; too large is the code gRPC answers
    a message over the same limit with."""
    answers: dict[str, tuple[int, str, str | None]] = {}
    limits = {"max_receive_message_bytes": 4096, "http_read_timeout_s": 0.2}
    async with serving_fakes(settings(tmp_path, **limits)) as (server, _):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Infer(
                    pb.InferRequest(model="m", prompt="x" * 8192), metadata=bearer("plain")
                )
            grpc_code = refused.value.code().name.lower()
        headers = {"authorization": f"Bearer {TOKENS['plain']}"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            for kind, content, content_type in (
                (BodyTooLargeError, b'{"prompt": "' + b"x" * 8192 + b'"}', "application/json"),
                (UnsupportedMediaTypeError, b"{}", "text/plain"),
                (MalformedRequestError, b"{", "application/json"),
            ):
                reply = await client.post(
                    "/v1/completions",
                    content=content,
                    headers={**headers, "content-type": content_type},
                )
                error = reply.json()["error"]
                answers[kind.__name__] = (reply.status_code, error["code"], error["param"])
        reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + TOKENS["plain"].encode() + b"\r\n"
            b"content-length: 64\r\n\r\n{"
        )
        async with asyncio.timeout(30):  # the server closes it once the rest is late too
            head, _, rest = (await reader.read()).partition(b"\r\n\r\n")
        writer.close()
        status = int(head.split(b" ")[1])
        error = json.loads(rest[rest.index(b"{") :])["error"]
        answers[BodyTimeoutError.__name__] = (status, error["code"], error["param"])
    for kind in (
        BodyTooLargeError,
        UnsupportedMediaTypeError,
        MalformedRequestError,
        BodyTimeoutError,
    ):
        status = http_answer(error_reply(kind("why")))[0]
        assert answers[kind.__name__] == (status, CODE_BY_ERROR[kind].name.lower(), "body")
        assert status == (kind.http_status or 400)
    assert answers["BodyTooLargeError"][:2] == (413, grpc_code)


async def test_the_model_list_is_kept_and_current_alike_on_both_doors(tmp_path):
    """ListModels and GET /v1/models both answer from what they kept while no model
    changed, and both show each change (and only the caller's models) in the next call."""
    async with (
        serving_fakes(settings(tmp_path)) as (server, _),
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client,
    ):
        stub = inference_pb2_grpc.InferenceServiceStub(channel)

        async def lists(caller: str) -> tuple[list[str], dict[str, Any]]:
            grpc_list = await stub.ListModels(pb.ListModelsRequest(), metadata=bearer(caller))
            headers = {"authorization": f"Bearer {TOKENS[caller]}"}
            first = await client.get("/v1/models", headers=headers)
            second = await client.get("/v1/models", headers=headers)
            assert first.content == second.content  # the kept answer, as it was
            cards = {card["id"]: card for card in second.json()["data"]}
            assert [s.name for s in grpc_list.models] == list(cards), caller
            return list(cards), cards

        for caller, models in (
            ("plain", ["m", "secret", "open-one"]),
            ("narrow", ["open-one"]),
        ):
            assert (await lists(caller))[0] == models
        assert (await lists("plain"))[1]["m"]["max_model_len"] is not None
        await stub.UnloadModel(pb.UnloadModelRequest(model="m"), metadata=bearer("plain"))
        assert (await lists("plain"))[1]["m"]["max_model_len"] is None
        assert (await lists("narrow"))[0] == ["open-one"]
        await stub.LoadModel(pb.LoadModelRequest(model="m"), metadata=bearer("plain"))
        assert (await lists("plain"))[1]["m"]["max_model_len"] is not None
