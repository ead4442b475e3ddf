"""The server's readiness and each model's, pushed to listeners (the grpc.health.v1
publisher), and the watcher that asks every loaded model's backend for its health.

`""` (the whole server) is ready while it accepts work and every model meant to be loaded
now is: the start-up models and those loaded since, less those deliberately unloaded or
evicted since (as Triton's readiness counts the models that should be loaded). A model
whose load failed, or whose backend lost it, still counts until it is unloaded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

from inferwire.core.metrics import MetricsListener
from inferwire.core.models import ManagedModel
from inferwire.core.status import ModelState

HealthListener = Callable[[dict[str, bool]], Awaitable[None]]


class Readiness:
    """What the manager's models are ready for, told to its listeners as it changes."""

    def __init__(
        self,
        models: Mapping[str, ManagedModel],
        metrics: MetricsListener,
        check_interval_s: float,
        cooldown_s: float,
    ) -> None:
        self._models = models
        self._metrics = metrics
        self._check_interval_s = check_interval_s
        self._cooldown_s = cooldown_s
        self._listeners: list[HealthListener] = []
        self.accepting = False  # set while the server accepts work

    def add_listener(self, listener: HealthListener) -> None:
        self._listeners.append(listener)

    @property
    def serving(self) -> bool:
        models = self._models.values()
        return self.accepting and all(m.ready for m in models if m.wanted)

    def statuses(self) -> dict[str, bool]:
        """Readiness keyed by model name, plus '' for the whole server."""
        statuses = {"": self.serving}
        statuses.update({name: self.accepting and m.serves for name, m in self._models.items()})
        return statuses

    async def publish(self) -> None:
        statuses = self.statuses()
        for name, model in self._models.items():
            self._metrics.readiness_changed(name, model.ready)
        for listener in self._listeners:
            await listener(statuses)

    async def watch_backends(self) -> None:
        """Run for the server's life: check every loaded model's backend each interval."""
        while True:
            await asyncio.sleep(self._check_interval_s)
            await self.check_backends()

    async def check_backends(self) -> None:
        await self.refresh([m for m in self._models.values() if m.state is ModelState.READY])

    async def refresh(self, models: list[ManagedModel]) -> None:
        """Ask these models' backends for their health; publish what changed."""
        # Checked concurrently, so one slow backend cannot delay the others' reports.
        results = await asyncio.gather(
            *(m.backend.health() for m in models), return_exceptions=True
        )
        now = time.monotonic()
        cooldown = self._cooldown_s
        changed = [m.checked(h, now, cooldown) for m, h in zip(models, results, strict=True)]
        if any(changed):
            await self.publish()
