"""all-MiniLM-L6-v2 served by the onnxruntime-encoder backend (`make minilm`), against
sentence-transformers' own pipeline on the same folder, through real clients: httpx, the
openai SDK (float and base64), LangChain's OpenAIEmbeddings, and gRPC; Tokenize; bad input
refused naming its field on both doors; ListModels' estimate against the load's RSS; the
import again reused, and a precision it does not make refused."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import yaml

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc as pb_grpc
from tests.realmodel.conftest import MINILM, MINILM_SOURCE
from tests.realmodel.corpus import CORPUS

# Varied texts: the tokenizer corpus (white space, digits, Unicode, code...), sentences of
# several lengths, and texts over the 256-token window (sent with truncate).
LONG = " ".join(f"sentence {i} of a long document about rivers and bridges." for i in range(60))
TEXTS = [
    *(t for t in CORPUS if t.strip()),
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "A quick brown fox jumps over the lazy dog " * 12,
    "SELECT name, COUNT(*) FROM users GROUP BY name HAVING COUNT(*) > 1;",
    LONG,
    "Zürich " * 300,
]


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.asarray((a * b).sum(axis=1))


@pytest.fixture(scope="module")
def reference(sentence_transformer) -> np.ndarray:
    return np.asarray(sentence_transformer.encode(TEXTS, normalize_embeddings=True))


@pytest.fixture(scope="module")
def stub(minilm_server):
    with grpc.insecure_channel(minilm_server.target) as channel:
        yield pb_grpc.InferenceServiceStub(channel)


def test_http_embeddings_equal_sentence_transformers(minilm_server, reference):
    reply = httpx.post(
        f"{minilm_server.http_url}/v1/embeddings",
        json={"model": "minilm", "input": TEXTS, "truncate": True},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert [d["index"] for d in body["data"]] == list(range(len(TEXTS)))
    served = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    assert served.shape == (len(TEXTS), 384)
    cosines = _cosines(served, reference)
    assert cosines.min() >= 0.9999, dict(zip(TEXTS, cosines.tolist(), strict=True))
    assert np.allclose(np.linalg.norm(served, axis=1), 1.0, atol=1e-4)  # normalized
    assert body["usage"]["prompt_tokens"] > 256 * 2  # the long ones were cut to the window


def test_grpc_embed_equals_sentence_transformers(stub, reference):
    reply = stub.Embed(pb.EmbedRequest(model="minilm", inputs=TEXTS, truncate=True), timeout=120)
    served = np.array([list(e.values) for e in reply.embeddings], dtype=np.float32)
    assert _cosines(served, reference).min() >= 0.9999
    assert reply.model == "minilm" and reply.usage.prompt_tokens > 0
    raw = stub.Embed(pb.EmbedRequest(model="minilm", inputs=TEXTS[:3], normalize=False), timeout=60)
    norms = [np.linalg.norm(list(e.values)) for e in raw.embeddings]
    assert all(abs(n - 1.0) > 1e-3 for n in norms), norms  # the pooled vectors as they are


def test_the_openai_sdk_float_and_base64(minilm_server, reference):
    import openai

    client = openai.OpenAI(base_url=f"{minilm_server.http_url}/v1", api_key="unused")
    texts = TEXTS[:8]
    floats = client.embeddings.create(model="minilm", input=texts, encoding_format="float")
    encoded = client.embeddings.create(model="minilm", input=texts, encoding_format="base64")
    as_floats = np.array([d.embedding for d in floats.data], dtype=np.float32)
    decoded = np.array(
        [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in encoded.data]  # type: ignore[arg-type]
    )
    assert np.array_equal(as_floats, decoded)
    assert _cosines(as_floats, reference[:8]).min() >= 0.9999
    assert floats.usage.prompt_tokens == encoded.usage.prompt_tokens > 0
    # The SDK's default asks for base64 and decodes it itself.
    default = client.embeddings.create(model="minilm", input=texts[0])
    assert np.allclose(default.data[0].embedding, as_floats[0])


def test_langchain_openai_embeddings(minilm_server, sentence_transformer):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model="minilm",
        base_url=f"{minilm_server.http_url}/v1",
        api_key="unused",  # type: ignore[arg-type]
        check_embedding_ctx_length=False,  # its docs' setting for servers other than OpenAI
    )
    documents = ["The Rhine flows into the North Sea.", "Bread is baked in an oven."]
    served = np.array(embeddings.embed_documents(documents), dtype=np.float32)
    query = np.array([embeddings.embed_query("Which river reaches the North Sea?")])
    expected = sentence_transformer.encode(documents, normalize_embeddings=True)
    assert _cosines(served, expected).min() >= 0.9999
    scores = _cosines(np.repeat(query, 2, axis=0), served)
    assert scores[0] > scores[1]


def test_tokenize_is_the_models_tokenizer(stub, sentence_transformer):
    text = "Tokenize this, please: naïve café 42."
    reply = stub.Tokenize(pb.TokenizeRequest(model="minilm", prompt=text), timeout=30)
    assert list(reply.token_ids) == sentence_transformer.tokenizer(text)["input_ids"]
    assert reply.count == len(reply.token_ids)


_OVER = "word " * 400  # 402 tokens with [CLS] and [SEP]
HTTP_ERRORS = [
    ("/v1/embeddings", {"input": []}, "input"),
    ("/v1/embeddings", {"input": ""}, "input"),
    ("/v1/embeddings", {"input": ["fine", ""]}, "input[1]"),
    ("/v1/embeddings", {"input": ["x"] * 257}, "input"),  # max_inputs: 256
    ("/v1/embeddings", {"input": ["fine", _OVER]}, "input[1]"),
    ("/v1/embeddings", {"input": [[101, 7592, 30522, 102]]}, "input[0]"),
    ("/v1/embeddings", {"input": "fine", "dimensions": 128}, "dimensions"),
    ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"query": "", "documents": ["d"]}, "query"),
]


@pytest.mark.parametrize(("path", "fields", "param"), HTTP_ERRORS)
def test_bad_input_is_a_400_naming_the_field(minilm_server, path, fields, param):
    reply = httpx.post(
        f"{minilm_server.http_url}{path}", json={"model": "minilm", **fields}, timeout=60
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param, error
    assert error["message"].startswith(f"{param}:"), error


def test_over_the_window_names_the_input_and_its_tokens(minilm_server):
    reply = httpx.post(
        f"{minilm_server.http_url}/v1/embeddings",
        json={"model": "minilm", "input": ["fine", _OVER]},
        timeout=60,
    )
    assert re.search(r"input\[1\]: is 402 tokens; the model's window is 256", reply.text)
    # With truncate it is cut to the window, as sentence-transformers cuts it.
    cut = httpx.post(
        f"{minilm_server.http_url}/v1/embeddings",
        json={"model": "minilm", "input": ["fine", _OVER], "truncate": True},
        timeout=60,
    )
    assert cut.status_code == 200 and cut.json()["usage"]["prompt_tokens"] == 3 + 256


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.Embed(pb.EmbedRequest(model="minilm")), "inputs"),
        (lambda s: s.Embed(pb.EmbedRequest(model="minilm", inputs=["ok", ""])), "inputs[1]"),
        (lambda s: s.Embed(pb.EmbedRequest(model="minilm", inputs=["ok", _OVER])), "inputs[1]"),
        (lambda s: s.Rerank(pb.RerankRequest(model="minilm", query="q")), "documents"),
        (lambda s: s.Infer(pb.InferRequest(model="minilm", prompt="Hi")), "model"),
    ],
)
def test_bad_grpc_calls_are_invalid_argument_naming_the_field(stub, call, field):
    with pytest.raises(grpc.RpcError) as raised:
        call(stub)
    details = raised.value.details() or ""
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(f"{field}:"), details
    if field == "model":  # Infer on an embedding model names its kind
        assert "embedding model" in details


def test_rerank_is_the_cosine_most_relevant_first(minilm_server, sentence_transformer):
    documents = ["Bananas are yellow.", "Paris is the capital of France.", "Cats sleep a lot."]
    query = "Which city is France's capital?"
    reply = httpx.post(
        f"{minilm_server.http_url}/v1/rerank",
        json={"model": "minilm", "query": query, "documents": documents, "top_n": 2},
        timeout=60,
    ).json()
    vectors = sentence_transformer.encode([query, *documents], normalize_embeddings=True)
    expected = vectors[1:] @ vectors[0]
    assert [r["index"] for r in reply["results"]] == list(np.argsort(-expected)[:2])
    for result in reply["results"]:
        assert abs(result["relevance_score"] - expected[result["index"]]) < 1e-4


def test_the_memory_estimate_is_within_a_fifth_of_the_loads_rss(stub):
    status = next(
        s for s in stub.ListModels(pb.ListModelsRequest(), timeout=30).models if s.name == "minilm"
    )
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    estimate = re.search(r"memory: ([\d.]+) (B|KiB|MiB|GiB) estimated", status.detail)
    measured = re.search(r"\+([\d.]+) (B|KiB|MiB|GiB) RSS at load", status.detail)
    assert estimate and measured, status.detail
    est, rss = (float(m[1]) * units[m[2]] for m in (estimate, measured))
    assert 0.8 * rss <= est <= 1.2 * rss, status.detail
    assert status.capabilities.embeddings and status.capabilities.rerank
    assert status.capabilities.embedding_dimensions == 384


def _import(*args: str) -> subprocess.CompletedProcess[str]:
    """`inferwire models import ARGS` (the tests below take minilm_server for its skip)."""
    inferwire = Path(sys.executable).with_name("inferwire")
    command = [str(inferwire), "models", "import", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def test_the_import_again_reuses_the_build_and_prints_an_encoder_entry(minilm_server):
    done = _import(str(MINILM_SOURCE), "--name", "minilm", "--out", str(MINILM))
    assert done.returncode == 0, done.stderr
    assert "reusing it" in done.stderr
    entry = yaml.safe_load(done.stdout)["models"][0]
    assert entry == {
        "name": "minilm",
        "backend": "onnxruntime-encoder",
        "options": {"path": str(MINILM)},
    }


def test_a_precision_other_than_fp32_is_refused_in_one_line(minilm_server, tmp_path):
    out = tmp_path / "minilm-int4"
    done = _import(str(MINILM_SOURCE), "--name", "x", "--out", str(out), "--precision", "int4")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "fp32 for the CPU only" in last, done.stderr
    assert "Traceback" not in done.stderr and not out.exists()


def test_health_and_metrics_name_the_model(minilm_server, stub):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(minilm_server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        checked = health.Check(health_pb2.HealthCheckRequest(service="model/minilm"), timeout=10)
    assert checked.status == health_pb2.HealthCheckResponse.SERVING
    stub.Embed(pb.EmbedRequest(model="minilm", inputs=["counted", "twice"]), timeout=60)
    metrics = httpx.get(f"{minilm_server.http_url}/metrics", timeout=10).text
    inputs = re.search(r'^inferwire_embedding_inputs_total\{model="minilm"\} ([\d.e+]+)$',
                       metrics, re.MULTILINE)  # fmt: skip
    assert inputs and float(inputs[1]) >= 2, metrics[:2000]
