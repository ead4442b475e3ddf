"""For each scenario: what a user learns from it, and which figure to look at first.

bench/results/README.md (bench/__main__.py's summary) shows it beside each scenario.
"""

from __future__ import annotations

GUIDE: dict[str, tuple[str, str]] = {
    "cpu_per_token": (
        "what the gateway costs per streamed token on the bundled model, by thread",
        "event-loop µs/token against the bare grpc.aio server's per message",
    ),
    "engine_overhead": (
        "how much of one stream's speed survives the gateway",
        "tokens/s ratio against og.Engine driven directly",
    ),
    "concurrency_scaling": (
        "whether many streams at once keep the engine's batched throughput",
        "aggregate tokens/s at 16 streams against og.Engine at 16",
    ),
    "triton_overhead": (
        "what inferwire adds in front of a Triton server",
        "requests/s and CPU per request against the bare proxy at concurrency 8",
    ),
    "kserve_overhead": (
        "what the KServe v2 streaming door costs next to InferStream",
        "the tokens/s ratio",
    ),
    "grpc_floor": (
        "the gateway's per-RPC cost against a bare grpc.aio echo",
        "requests/s ratio at concurrency 32, then CPU per request",
    ),
    "http_overhead": (
        "what the OpenAI HTTP door costs per streamed token",
        "the HTTP row's event-loop µs/token against the SSE floor's and gRPC's",
    ),
    "gateway_capacity": (
        "how many streams the gateway alone carries at 50 tokens/s each",
        "delivered / offered at 256 streams, then the added ITL p99",
    ),
    "ghz_infer": (
        "the gateway's unary cost measured by a Go load generator",
        "requests/s ratio against Triton's own ModelInfer",
    ),
    "memory": ("whether the server's memory grows under load", "RSS growth over 10,000 requests"),
    "startup_time": ("how long until the server listens and serves", "launch to SERVING"),
    "model_swap": (
        "what loading on demand and eviction cost",
        "first request after an unload against a resident one",
    ),
    "tenant_isolation": (
        "whether a quiet tenant keeps its latency beside a noisy one",
        "the quiet tenant's TTFT p50 with the noise, with tenants against one FIFO queue",
    ),
    "adapters": ("what a LoRA adapter model costs against its base", "the tokens/s ratio"),
    "peers": (
        "how inferwire compares with llama.cpp's llama-server, the server a user would "
        "run instead, on the same weights under aiperf",
        "output tokens/s × llama.cpp's at each concurrency, then TTFT p50 and CPU per token",
    ),
    "embeddings_minilm": (
        "whether served embeddings equal sentence-transformers' and keep up with its "
        "offline encode on the same core",
        "the cosine's minimum, then texts/s × offline encode and p50 × one encode",
    ),
    "routing_prefix": (
        "whether llm-d's picker scoring prefix locality shortens later turns' TTFT over "
        "3 replicas, and which prefix scorer (approximate or precise) to ship",
        "later turns' TTFT p50 × the prefix-blind picker's, then the share landing on the "
        "previous turn's replica",
    ),
}


def guide(scenario: str) -> str:
    learn, first = GUIDE.get(scenario, ("", ""))
    return f"{learn}; look first at: {first}" if learn else ""
