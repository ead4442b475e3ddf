"""Servers with a tokens file, over fake backends, and the metadata their callers send."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from inferwire.config import load_settings
from inferwire.core.auth import hash_token
from inferwire.server import InferwireServer
from tests.support.fake_backend import FAKE_BACKEND, FakeBackends

# name -> (token, scopes, model patterns or None for every model)
Tokens = dict[str, tuple[str, list[str], list[str] | None]]


def tokens_yaml(tokens: Tokens) -> str:
    entries = []
    for name, (token, scopes, models) in tokens.items():
        entry: dict[str, Any] = {"name": name, "sha256": hash_token(token), "scopes": scopes}
        if models is not None:
            entry["models"] = models
        entries.append(entry)
    return yaml.safe_dump(entries)


async def start_server(tokens_file: Path, **auth_settings: Any) -> InferwireServer:
    """A started server on 127.0.0.1:0 with models `m` (loaded) and `idle`."""
    settings = load_settings(
        server={
            "address": "127.0.0.1:0",
            "health_check_interval_s": 3600,
            "auth": {"tokens_file": str(tokens_file), **auth_settings},
        },
        models=[
            {"name": "m", "backend": FAKE_BACKEND, "load_on_startup": True},
            {"name": "idle", "backend": FAKE_BACKEND},
        ],
    )
    server = InferwireServer(settings, backend_factory=FakeBackends())
    await server.start()
    return server


def bearer(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()
