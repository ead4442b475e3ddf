"""`options` of a model served by Triton: the keys a configuration may set."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from inferwire.addresses import split_host_port
from inferwire.core.backend import BackendOptions

# Whether a model streams deltas or its whole text so far; auto detects it.
StreamMode = Literal["auto", "delta", "cumulative"]


class TritonOptions(BackendOptions):
    """`options` for a model served by Triton Inference Server."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    url: str | None = None
    """host:port of Triton's gRPC endpoint."""
    urls: list[str] = Field(default_factory=list)
    """Several Triton gRPC endpoints serving the model."""
    discovery: Literal["static", "dns"] = "static"
    """static: the urls as given; dns: each url's host name resolved to all its addresses
    (A and AAAA), one endpoint per address, resolved again every dns_refresh_s."""
    dns_refresh_s: float = Field(default=5.0, gt=0)
    """With discovery dns: seconds between resolutions."""
    dns_server: str | None = None
    """With discovery dns: host:port of the DNS server to ask (default: the system resolver)."""
    triton_model: str | None = None
    """The model's name on Triton (default: our model name)."""
    version: str = ""
    """Model version on Triton ('' = Triton's policy)."""
    convention: Literal["auto", "vllm", "tensorrt-llm"] = "auto"
    """Input convention; auto detects it from the model metadata."""
    stream_output: StreamMode = "auto"
    """Whether the model streams deltas or cumulative text; auto detects it."""
    tokenizer: str | None = None
    """Directory with genai_config.json and tokenizer.json, used to count tokens when the
    model returns no counts."""
    chat_template: str | None = None
    """The model's chat template, rendered in inferwire for chat requests: a
    tokenizer_config.json (its chat_template, bos_token and eos_token) or a Jinja file."""
    tls: bool = False
    """Connect with TLS."""
    tls_root_cert: str | None = None
    """PEM file of trusted roots."""
    tls_cert: str | None = None
    """PEM client certificate chain (mTLS)."""
    tls_key: str | None = None
    """PEM client private key (mTLS)."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra request headers, e.g. the --grpc-restricted-protocol key."""
    request_timeout_s: float | None = Field(default=300.0, gt=0)
    """Longest a request may run on Triton when our client set no shorter deadline
    (null: no limit). 300 s lets the longest answer allowed (max_output_tokens, 4096 by
    default) finish at 15 tokens a second after a minute of queueing and prefill; a
    request to a Triton that stopped answering still ends, instead of waiting forever."""
    deadline_margin_s: float = Field(default=0.05, ge=0)
    """Subtracted from our client's deadline to give Triton's deadline."""
    connect_timeout_s: float = Field(default=30.0, ge=0)
    """How long a load waits for Triton to accept connections (it may still be starting);
    then the load fails UNAVAILABLE."""
    health_interval_s: float = Field(default=0.5, gt=0)
    """Seconds between checks of every endpoint (ServerLive, and ModelReady for this model;
    never the server-wide ServerReady) while the model is loaded; the model's health
    reports the last check."""
    health_timeout_s: float = Field(default=1.0, gt=0)
    """Timeout of each health RPC."""
    reload_lost_models: bool = True
    """When a Triton endpoint is back (a restart, a new pod) without the model, load it
    there again at the next endpoint check (explicit model-control mode)."""
    control_timeout_s: float = Field(default=120.0, gt=0)
    """Timeout of metadata, load and unload RPCs."""
    max_reconnect_backoff_s: float = Field(default=1.0, gt=0)
    """Longest wait between reconnection attempts."""
    keepalive_time_s: float = Field(default=20.0, gt=0)
    """Seconds between HTTP/2 pings on a connection with requests in flight: a half-open
    connection (a peer that vanished without a reset) is found within keepalive_time_s +
    keepalive_timeout_s, and its requests fail over or end UNAVAILABLE. Triton's default
    ping policy accepts this: the endpoint checks keep data flowing on the connection."""
    keepalive_timeout_s: float = Field(default=10.0, gt=0)
    """How long a ping may go unanswered before the connection counts as dead."""
    max_output_tokens: int = Field(default=4096, ge=1)
    """Largest max_tokens a request may ask for."""
    max_loaded_models: int | None = Field(default=None, ge=1)
    """The most models inferwire keeps loaded at once on this model's endpoints (its
    pool, the same urls); a load beyond it evicts an idle one (server.memory). Triton does
    not report per-model memory, so the budget counts models. Unset: no limit."""
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    """Triton's metrics port (its --metrics-port, 8002 by default), the same on the host of
    every url: while the model is loaded, the backend reads the KV-cache gauge of Triton's
    TensorRT-LLM or vLLM backend from http://<host>:<metrics_port>/metrics about once a
    second, and reports the fullest endpoint's as the model's KV-cache usage (the
    inference gateway's `vllm:kv_cache_usage_perc`). Unset: not read, the usage is unknown."""

    @model_validator(mode="after")
    def _one_way_to_name_endpoints(self) -> TritonOptions:
        if (self.url is None) == (not self.urls):
            raise ValueError("set exactly one of url or urls")
        if len(set(self.endpoints)) != len(self.endpoints):
            raise ValueError("urls must not repeat")
        if self.discovery == "static" and self.dns_server is not None:
            raise ValueError("dns_server needs discovery: dns")
        if self.discovery == "dns" or self.metrics_port is not None:
            # A host is needed to resolve, and to find the metrics port on.
            for url in [*self.endpoints, *([self.dns_server] if self.dns_server else [])]:
                split_host_port(url)  # raises ValueError: "'triton' is not host:port"
        return self

    @property
    def endpoints(self) -> list[str]:
        return [self.url] if self.url is not None else list(self.urls)

    @property
    def uses_tls(self) -> bool:
        return self.tls or any((self.tls_root_cert, self.tls_cert, self.tls_key))
