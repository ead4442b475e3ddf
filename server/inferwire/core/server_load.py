"""The whole server's load, as one figure each: what a router in front of several replicas
needs to pick one (the Kubernetes inference gateway's endpoint picker reads it as vLLM's
gauges, metrics/model_server.py).

- waiting: requests in a model's queue, or waiting for an on-demand model to load;
- running: requests holding a slot (generating);
- KV-cache usage, 0 to 1: for the embedded engine, the tokens its running requests hold
  (prompt and generated so far) over what its loaded models can hold (each model's
  `max_concurrency` × its context window); a backend that reads its own engine's gauge
  (Triton, `Backend.kv_cache_usage`) gives that; the server reports the fullest of them;
- adapters: which adapter models are resident or running, which have requests waiting,
  how many there are, and how many could be resident at once within the memory budget;
- accepting: False once the server drains, when the gateway should stop choosing it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from inferwire.core.models import ManagedModel
from inferwire.core.residency import Residency
from inferwire.core.status import ModelState


@dataclass(frozen=True)
class ServerLoad:
    waiting: int
    running: int
    kv_cache_usage: float
    adapters_running: tuple[str, ...]
    adapters_waiting: tuple[str, ...]
    max_adapters: int
    adapters_known: int = 0
    accepting: bool = True


def server_load(
    models: Iterable[ManagedModel], residency: Residency, accepting: bool = True
) -> ServerLoad:
    models = list(models)
    waiting = sum(m.queued + m.load_waiters for m in models)
    running = sum(m.running for m in models)
    held = capacity = 0
    reported: list[float] = []
    for model in models:
        facts = model.facts
        if model.state is not ModelState.READY or facts is None:
            continue
        usage = model.backend.kv_cache_usage()
        if usage is not None:
            reported.append(usage)
        elif facts.limits.context_length:
            held += model.live_tokens
            capacity += model.spec.max_concurrency * facts.limits.context_length
    usage = max([held / capacity if capacity else 0.0, *reported])
    adapters = [m for m in models if m.base is not None]
    return ServerLoad(
        waiting=waiting,
        running=running,
        kv_cache_usage=min(max(usage, 0.0), 1.0),
        adapters_running=tuple(
            sorted(a.name for a in adapters if a.state is ModelState.READY or a.running)
        ),
        adapters_waiting=tuple(sorted(a.name for a in adapters if a.queued or a.load_waiters)),
        max_adapters=residency.resident_at_once(adapters),
        adapters_known=len(adapters),
        accepting=accepting,
    )
