"""Configuration: a YAML file, with INFERWIRE_* environment variables and flags on top.

Precedence, highest first: command-line flags, environment variables
(`INFERWIRE_SERVER__ADDRESS`, `INFERWIRE_MODELS='[...]'`, nested keys joined
by `__`), the YAML file given with `--config`, then the defaults below.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from inferwire.core.validation import MODEL_NAME_PATTERN

DEFAULT_MODEL_NAME = "demo"


class ServerSettings(BaseModel):
    """The `server:` block."""

    model_config = ConfigDict(extra="forbid")

    address: str = "0.0.0.0:50051"
    """host:port to listen on. Port 0 picks a free port (printed at start-up)."""
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
    log_format: Literal["json", "text"] = "json"
    """json: one structured object per line; text: for people at a terminal."""
    log_level: str = "INFO"
    """Python logging level name."""


class ModelConfig(BaseModel):
    """One entry of the `models:` list."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=MODEL_NAME_PATTERN)
    """The name clients use; also the grpc.health.v1 service `model/<name>`."""
    backend: str = "onnxruntime-genai"
    """Backend that serves the model: onnxruntime-genai (embedded) or triton."""
    load_on_startup: bool = False
    """Load when the server starts; the server reports SERVING only once it is READY."""
    max_concurrency: int = Field(default=8, ge=1)
    """Requests the model runs at once."""
    max_queue: int = Field(default=64, ge=0)
    """Requests that may wait for a slot; beyond that, RESOURCE_EXHAUSTED."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Backend-specific settings, validated by the backend; unknown keys are an error."""


def default_models() -> list[ModelConfig]:
    return [
        ModelConfig(
            name=DEFAULT_MODEL_NAME,
            backend="onnxruntime-genai",
            load_on_startup=True,
            options={"path": "builtin", "device": "cpu"},
        )
    ]


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
        seen: set[str] = set()
        for model in models:
            if model.name in seen:
                raise ValueError(f"model {model.name!r} is declared twice")
            seen.add(model.name)
        return models

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


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build settings from an optional YAML file, the environment and explicit overrides."""
    if config_file is not None and not config_file.is_file():
        raise FileNotFoundError(f"configuration file {config_file} not found")

    class FileSettings(Settings):
        model_config = SettingsConfigDict(yaml_file=config_file)

    return FileSettings(**overrides)
