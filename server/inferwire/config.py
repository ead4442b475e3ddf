"""Configuration: a YAML file, with INFERWIRE_* environment variables and flags on top.

Precedence, highest first: command-line flags, environment variables
(`INFERWIRE_SERVER__ADDRESS`, `INFERWIRE_MODELS='[...]'`, nested keys joined
by `__`), the YAML file given with `--config`, then the defaults below.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    YamlConfigSettingsSource,
)

from inferwire.addresses import is_unix_socket, split_host_port
from inferwire.core.adapters import AdapterSettings
from inferwire.core.errors import ConfigurationError
from inferwire.core.kv_blocks import KvEventsSettings
from inferwire.core.memory import ByteSize, MemorySettings
from inferwire.core.specs import duplicate_name
from inferwire.core.tenants import (
    SchedulingSettings,
    TenantConfig,
    Tenants,
    TenantSettings,
    duplicate_tenant,
)
from inferwire.model_config import (
    BACKENDS,
    BackendLookup,
    ModelConfig,
    default_models,
    on_base_backend,
)

LogLevel = Literal["CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"]


class TlsSettings(BaseModel):
    """The `server.tls:` block. Unset (the default): the listener is plaintext."""

    model_config = ConfigDict(extra="forbid")

    cert_file: Path | None = None
    """PEM certificate (chain) the server presents; with key_file it turns TLS on. Re-read
    when it changes on disk: new connections use the new one, open ones stay as they are."""
    key_file: Path | None = None
    """PEM private key of cert_file, unencrypted; re-read with it."""
    client_ca_file: Path | None = None
    """PEM CA certificates; set, it turns on mutual TLS: every client must present a
    certificate these signed. Re-read when it changes."""

    @field_validator("cert_file", "key_file", "client_ca_file", mode="before")
    @classmethod
    def _empty_is_unset(cls, path: object) -> object:
        return None if path == "" else path

    @model_validator(mode="after")
    def _complete(self) -> TlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file are set together, or neither")
        if self.client_ca_file is not None and self.cert_file is None:
            raise ValueError("client_ca_file (mutual TLS) needs cert_file and key_file too")
        return self

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None


class AuthSettings(BaseModel):
    """The `server.auth:` block: bearer tokens and their scopes."""

    model_config = ConfigDict(extra="forbid")

    tokens_file: Path | None = None
    """YAML list of {name, sha256, scopes, models}; re-read when it changes. Unset: every
    RPC is open (local development)."""
    anonymous_scopes: list[Literal["infer", "admin", "gateway"]] = Field(default_factory=list)
    """Scopes granted to callers without a token, e.g. [infer]; only with a tokens file."""
    open_services: list[str] = Field(
        default_factory=lambda: [
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
            "grpc.reflection.v1.ServerReflection",
        ]
    )
    """Services every caller may use without a token (probes, grpcurl's reflection)."""
    certificate_tenants: dict[str, str] = Field(default_factory=dict)
    """With mutual TLS: a client certificate's subject CN or URI SAN -> the tenant its
    calls count against (when they send no token); the subject becomes the principal."""
    gateway_subjects: list[str] = Field(default_factory=list)
    """With mutual TLS: client certificate subjects (CN or URI SAN) allowed to speak for
    others, as a token with the `gateway` scope is: their calls' gateway headers are
    honoured (docs/deployment.md#behind-the-kubernetes-inference-gateway)."""


Level = Literal["interactive", "standard", "batch"]
# InferenceObjective names llm-d's examples use, by the priority they ask for.
DEFAULT_OBJECTIVES: dict[str, Level] = {
    "critical": "interactive",
    "default": "standard",
    "sheddable": "batch",
}


class GatewaySettings(BaseModel):
    """The `server.gateway:` block: what the Kubernetes inference gateway's headers mean."""

    model_config = ConfigDict(extra="forbid")

    objectives: dict[str, Level] = Field(default_factory=lambda: dict(DEFAULT_OBJECTIVES))
    """`x-gateway-inference-objective` name -> the priority it asks for (never above the
    tenant's own)."""


class TransportSettings(BaseModel):
    """The `server.transport:` block: HTTP/2 limits that protect the server from its clients."""

    model_config = ConfigDict(extra="forbid")

    max_metadata_bytes: int = Field(default=16 * 1024, ge=1024)
    """Largest request metadata block (headers); bigger ones are refused. The HTTP API
    holds a request's head (request line and headers) to the same size: 431 beyond it."""
    max_concurrent_streams: int = Field(default=4096, ge=1)
    """Concurrent RPCs per HTTP/2 connection. A client that knows the limit queues further
    calls; a burst sent on a new connection before the client has read the limit is
    refused beyond it (UNAVAILABLE, REFUSED_STREAM; grpc's C-core clients do not retry
    it), so this is set above any burst one client sends: the admission queue
    (`max_queue`), not HTTP/2, is what answers a call the server cannot take now."""
    max_pending_calls: int = Field(default=16384, ge=1)
    """Calls that arrived and wait for the server to pick them up (grpc's request matcher,
    over all connections); beyond it grpc cancels new ones (CANCELLED). grpc's own default,
    1,000 (3,000 hard), cancels part of a burst of a thousand streams before admission can
    answer RESOURCE_EXHAUSTED."""
    keepalive_min_ping_interval_s: float = Field(default=60.0, gt=0)
    """Shortest interval between client pings; pinging faster earns strikes."""
    keepalive_max_ping_strikes: int = Field(default=2, ge=0)
    """Strikes before the connection is closed with GOAWAY too_many_pings (0: never)."""
    keepalive_permit_without_calls: bool = False
    """Whether clients may ping a connection that has no RPC in flight."""
    max_connection_age_s: float | None = Field(default=1800.0, gt=0)
    """Close connections this old (GOAWAY), so clients reconnect and spread over replicas;
    null: never."""
    max_connection_age_grace_s: float = Field(default=300.0, ge=0)
    """How long RPCs in flight on an aged connection may still finish."""


RESPONSES_FILE = "responses.sqlite3"  # the default store's file, in server.state_dir


def default_state_dir() -> Path:
    """`$XDG_STATE_HOME/inferwire`, else `~/.local/state/inferwire` (the XDG Base
    Directory defaults); a user without a home: the temporary directory's
    `inferwire-state`."""
    xdg = os.environ.get("XDG_STATE_HOME", "")
    if xdg and Path(xdg).is_absolute():  # the specification ignores a relative one
        return Path(xdg) / "inferwire"
    try:
        return Path.home() / ".local" / "state" / "inferwire"
    except RuntimeError:
        return Path(tempfile.gettempdir()) / "inferwire-state"


class ResponsesSettings(BaseModel):
    """The `server.responses:` block: the stored responses of OpenAI's Responses API
    (`store: true`, the default), which `previous_response_id` and `GET
    /v1/responses/{id}` read; per model, evicted oldest first, in the store `store` names."""

    model_config = ConfigDict(extra="forbid")

    store: str | None = None
    """Where they are kept: `memory` (this process; lost on restart), `sqlite:///PATH` (a
    file; a relative PATH, as in `sqlite://responses.sqlite3`, is under
    `server.state_dir`) or `postgresql://…` (a PostgreSQL database that replicas
    share). Unset: `sqlite:///<server.state_dir>/responses.sqlite3`."""
    max_entries: int = Field(default=1024, ge=0)
    """Responses each model's store holds; beyond it the oldest is evicted (0: none are
    stored, and `previous_response_id` finds nothing)."""
    max_bytes: ByteSize = Field(default=64 * 1024 * 1024, ge=0)
    """Bytes each model's store holds (a response counted as its JSON and the whole
    conversation it carries); beyond it the oldest are evicted, and a response larger
    than this alone is not stored. Sizes take KiB, MiB, GiB or plain bytes."""

    @field_validator("store")
    @classmethod
    def _known_store(cls, store: str | None) -> str | None:
        if store is None or store == "memory":
            return store
        if store.startswith("sqlite://") and store.removeprefix("sqlite://").strip("/"):
            return store
        if store.startswith(("postgresql://", "postgres://")):
            return store
        raise ValueError(
            "must be memory, sqlite:///PATH or postgresql://[user[:password]@]host[:port]/"
            f"database, got {store[:64]!r}"
        )


class ServerSettings(BaseModel):
    """The `server:` block."""

    model_config = ConfigDict(extra="forbid")

    address: str = "0.0.0.0:50051"
    """host:port to listen on ([::]:port for IPv6, or unix:/path). Port 0 picks a free port
    (printed at start-up)."""
    grace_period_s: float = Field(default=30.0, ge=0)
    """On SIGTERM/SIGINT, how long in-flight RPCs may run before they are cancelled."""
    shutdown_delay_s: float = Field(default=0.0, ge=0)
    """On SIGTERM/SIGINT, how long to keep accepting RPCs after health turns NOT_SERVING,
    so load balancers stop routing here first (Kubernetes: like a preStop sleep)."""
    max_receive_message_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    """Largest request message the server accepts; bigger ones get RESOURCE_EXHAUSTED."""
    max_prompt_bytes: int = Field(default=256 * 1024, ge=1)
    """Largest prompt (and prompt plus context) in UTF-8 bytes; bigger is INVALID_ARGUMENT."""
    health_check_interval_s: float = Field(default=2.0, gt=0)
    """How often loaded models' backends are health-checked for grpc.health.v1."""
    log_format: Literal["auto", "json", "text"] = "auto"
    """json: one structured object per line; text: for people at a terminal; auto: text
    when standard error is a terminal, json otherwise (a pipe, a file, a container log)."""
    log_level: LogLevel = "INFO"
    """Python logging level name: CRITICAL, ERROR, WARNING, INFO or DEBUG (any case)."""
    exit_on_startup_failure: bool = True
    """Exit (status 1) when a `load_on_startup` model fails to load, as Triton does;
    false keeps serving the other models, with the server NOT_SERVING."""
    http_address: str = "0.0.0.0:8000"
    """host:port of the OpenAI-compatible HTTP API (docs/http.md), on the same models as
    gRPC; port 0 picks a free port (logged at start-up); an empty string turns it off."""
    http_read_timeout_s: float = Field(default=30.0, gt=0)
    """How long an HTTP client may take to send a request's headers (else the connection
    is closed), and then its body (else 408): slow senders (slowloris) hold a connection
    this long and no longer."""
    metrics_address: str = "0.0.0.0:9464"
    """host:port ([::]:port for IPv6) where Prometheus scrapes `/metrics`; port 0 picks a
    free port (logged at start-up); an empty string turns metrics off."""
    health_address: str = ""
    """host:port of a second, plaintext listener that serves grpc.health.v1 only, for
    probes that cannot speak TLS (Kubernetes' native gRPC probes); empty (the default): off."""
    log_prompts: bool = False
    """Write prompt and output text into the request log. Off by default: prompts may
    hold personal or confidential data."""
    tracing: bool | None = None
    """OpenTelemetry tracing (the `inferwire[otel]` extra), configured by the OTEL_*
    variables. Unset (the default): on when OTEL_TRACES_EXPORTER names an exporter or
    OTEL_SERVICE_NAME is set; true without the extra is a start-up error."""
    tls: TlsSettings = Field(default_factory=TlsSettings)
    """TLS (cert_file, key_file) and mutual TLS (client_ca_file) for the listener."""
    auth: AuthSettings = Field(default_factory=AuthSettings)
    """Bearer tokens and scopes; by default none (every RPC open)."""
    transport: TransportSettings = Field(default_factory=TransportSettings)
    """HTTP/2 limits: metadata size, streams per connection, keepalive, connection age."""
    memory: MemorySettings = Field(default_factory=MemorySettings)
    """Memory budgets per device (`budgets`), `load_wait_s` and `min_resident_s`: models
    load within them, evicting idle ones least recently used first."""
    adapters: AdapterSettings = Field(default_factory=AdapterSettings)
    """Run-time adapter registration: `allowed_dirs` (empty, the default: off)."""
    tenants: list[TenantConfig] = Field(default_factory=list)
    """Who shares the models: each with name, priority, weight and optional quotas
    (max_concurrency, requests_per_minute, generated_tokens_per_minute); docs/tenants.md."""
    default_tenant: TenantSettings = Field(default_factory=TenantSettings)
    """Settings of callers whose credentials name no configured tenant."""
    scheduling: SchedulingSettings = Field(default_factory=SchedulingSettings)
    """How the model queues admit: `max_wait_s`, after which a batch request ages up."""
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    """The Kubernetes inference gateway's objectives, by name (docs/deployment.md)."""
    responses: ResponsesSettings = Field(default_factory=ResponsesSettings)
    """The Responses API's stored responses: `store` (memory, sqlite, postgresql), and
    per model `max_entries`, `max_bytes` (docs/http.md)."""
    kv_events: KvEventsSettings = Field(default_factory=KvEventsSettings)
    """Models' KV cache blocks published for llm-d's precise prefix-cache scorer:
    `endpoint` (a ZeroMQ PUB address; unset: off), `replay_endpoint`, `topic`."""
    state_dir: Path = Field(default_factory=default_state_dir)
    """The directory where the server keeps what outlives a restart (the default
    Responses store's file); created when first needed. Default:
    `$XDG_STATE_HOME/inferwire`, else `~/.local/state/inferwire`."""

    @model_validator(mode="after")
    def _known_tenants(self) -> ServerSettings:
        if (problem := duplicate_tenant(self.tenants)) is not None:
            raise ValueError(f"tenants: {problem}")
        names = {t.name for t in self.tenants}
        for subject, tenant in self.auth.certificate_tenants.items():
            if tenant not in names:
                raise ValueError(
                    f"auth.certificate_tenants[{subject!r}]: {tenant!r} is not in server.tenants"
                )
        return self

    def tenant_registry(self) -> Tenants:
        return Tenants(self.tenants, self.default_tenant, self.scheduling)

    @field_validator("state_dir")
    @classmethod
    def _expanded(cls, state_dir: Path) -> Path:
        return state_dir.expanduser()

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_in_any_case(cls, level: object) -> object:
        return level.upper() if isinstance(level, str) else level

    @field_validator("metrics_address", "health_address", "http_address")
    @classmethod
    def _metrics_host_and_port(cls, address: str) -> str:
        return address and _require_host_and_port(address)

    @field_validator("address")
    @classmethod
    def _host_and_port(cls, address: str) -> str:
        if is_unix_socket(address):
            return address
        return _require_host_and_port(address)


def _require_host_and_port(address: str) -> str:
    try:
        split_host_port(address)
    except ValueError:
        raise ValueError(
            f"must be host:port with a port from 0 to 65535 (for example 0.0.0.0:50051 "
            f"or [::]:50051), got {address!r}"
        ) from None
    return address


class Settings(BaseSettings):
    """All of inferwire's settings."""

    model_config = SettingsConfigDict(
        env_prefix="INFERWIRE_", env_nested_delimiter="__", extra="forbid"
    )

    server: ServerSettings = Field(default_factory=ServerSettings)
    """Listener, limits, shutdown and logging."""
    models: list[ModelConfig] = Field(default_factory=default_models)
    """The models this server may serve; by default the bundled `demo` model."""

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ModelConfig]) -> list[ModelConfig]:
        if (problem := duplicate_name(models)) is not None:
            raise ValueError(problem)
        return [on_base_backend(model, models) for model in models]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, YamlConfigSettingsSource(settings_cls))


def load_settings(
    config_file: Path | None = None, backends: BackendLookup | None = None, **overrides: Any
) -> Settings:
    """Build settings from an optional YAML file, the environment and explicit overrides;
    with `backends` (a name's backend class), each model's options are checked too.

    Raises ConfigurationError with a one-line message naming each bad key and why.
    """
    if config_file is not None:
        _check_yaml_file(config_file)

    class FileSettings(Settings):
        model_config = SettingsConfigDict(yaml_file=config_file)

    token = BACKENDS.set(backends)
    try:
        return FileSettings(**overrides)
    except ValidationError as exc:
        raise ConfigurationError("; ".join(map(_describe, exc.errors()))) from None
    except SettingsError as exc:  # e.g. INFERWIRE_MODELS that is not JSON
        cause = f": {exc.__cause__}" if exc.__cause__ else ""
        raise ConfigurationError(f"{exc}{cause}") from None
    finally:
        BACKENDS.reset(token)


def _check_yaml_file(config_file: Path) -> None:
    """Fail early, in one line, on a file that is missing, not YAML or not a mapping."""
    if not config_file.is_file():
        raise ConfigurationError(f"configuration file {config_file} not found")
    try:
        content = yaml.safe_load(config_file.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigurationError(f"{config_file}{where}: not valid YAML: {problem}") from None
    if content is not None and not isinstance(content, dict):
        raise ConfigurationError(
            f"{config_file}: the top level must be a mapping (server:, models:), "
            f"not a {type(content).__name__}"
        )


def _describe(error: ErrorDetails) -> str:
    """One pydantic error as `models[1].name: why`, without pydantic's internals."""
    where = ""
    for part in error["loc"]:
        where += f"[{part}]" if isinstance(part, int) else f".{part}" if where else str(part)
    if error["type"] == "extra_forbidden":
        why = "unknown key"
    elif error["type"] == "value_error":
        why = str(error.get("ctx", {}).get("error", error["msg"]))
    else:
        why = error["msg"]
    return f"{where}: {why}" if where else why
