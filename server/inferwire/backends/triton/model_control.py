"""The model on its Triton endpoints: load, unload, load again where lost, join.

Loading goes through Triton's repository API (explicit model-control mode); a model
already ready counts as loaded. While the model is loaded, a periodic check (every
`health_interval_s`) refreshes each endpoint's health and, with `reload_lost_models`,
loads the model again where a restarted Triton came back without it. That check is the
only self-healing: the backend's `health()` just reports what the last one found.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from tritonclient.grpc import service_pb2

from inferwire.backends.triton.conventions import TritonModelLayout, describe_model
from inferwire.backends.triton.endpoints import Endpoint, EndpointPool
from inferwire.backends.triton.errors import Origin
from inferwire.backends.triton.options import TritonOptions
from inferwire.backends.triton.tasks import stop_task
from inferwire.core.errors import (
    BackendUnavailableError,
    ModelNotFoundError,
    ModelNotReadyError,
)

log = logging.getLogger(__package__)

# Each endpoint, and whether the model had to be loaded there (or why it could not be).
LoadOutcomes = list[tuple[Endpoint, bool | BaseException]]


class ModelControl:
    """Loads and unloads one model on the endpoints of its pool, and keeps it loaded."""

    def __init__(self, pool: EndpointPool, options: TritonOptions) -> None:
        self._pool = pool
        self._options = options
        self._model_name = pool.model_name
        self._triton_model = pool.triton_model
        self._checks: asyncio.Task[None] | None = None

    async def load(self, has_tokenizer: bool) -> TritonModelLayout:
        """Make the model ready on every endpoint of the open pool; return its layout.

        At least one endpoint must have it ready. On failure the pool is closed and Triton
        is left as we found it: only what this call loaded is unloaded.
        """
        outcomes = await self._load_on_each(self._pool.endpoints)
        try:
            self._mark(outcomes)
            ready = next(ep for ep, result in outcomes if not isinstance(result, BaseException))
            return await self._inspect(ready, has_tokenizer)
        except BaseException:
            loaded = [ep for ep, result in outcomes if result is True]
            await asyncio.gather(*(self._unload_on(endpoint) for endpoint in loaded))
            await self._pool.close()
            raise

    async def unload(self) -> None:
        await asyncio.gather(*(self._unload_on(endpoint) for endpoint in self._pool.endpoints))

    async def reconcile(self) -> None:
        """Load the model again on every endpoint that no longer has it (a Triton restart)."""
        self._mark(await self._load_again(self._pool.endpoints))

    async def join(self, url: str) -> None:
        """Load the model on an endpoint DNS now names; admit it once healthy there."""
        endpoint = self._pool.add(url)
        try:
            await self._load_on(endpoint)
            await self._pool.check_one(endpoint)
            if not endpoint.healthy:
                raise BackendUnavailableError(endpoint.detail)
        except Exception as exc:
            log.warning(
                "new Triton endpoint could not serve the model; trying again at the next "
                "resolution",
                extra={"model": self._model_name, "url": url, "error": str(exc)},
            )
            self._pool.drain(url)
            return
        self._pool.admit(endpoint)

    # ---- the periodic check ----------------------------------------------

    def start_checks(self) -> None:
        if self._checks is None:
            self._checks = asyncio.create_task(
                self._check_periodically(), name=f"triton-checks-{self._model_name}"
            )

    async def stop_checks(self) -> None:
        checks, self._checks = self._checks, None
        await stop_task(checks)

    async def _check_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._options.health_interval_s)
            try:
                await self.check()
            except Exception:
                log.exception("Triton endpoint check failed", extra={"model": self._model_name})

    async def check(self) -> None:
        """Refresh every endpoint's health; load the model again where a live Triton lost it."""
        await self._pool.check()
        lost = [ep for ep in self._pool.endpoints if ep.lost_model]
        if not (lost and self._options.reload_lost_models):
            return
        for endpoint, result in await self._load_again(lost):
            if isinstance(result, BaseException):
                endpoint.detail = f"model not ready, and loading it again failed: {result}"
            else:
                endpoint.healthy, endpoint.detail, endpoint.lost_model = True, "", False

    # ---- one endpoint ------------------------------------------------------

    async def _load_on_each(self, endpoints: list[Endpoint]) -> LoadOutcomes:
        results = await asyncio.gather(
            *(self._load_on(endpoint) for endpoint in endpoints), return_exceptions=True
        )
        return list(zip(endpoints, results, strict=True))

    async def _load_again(self, endpoints: list[Endpoint]) -> LoadOutcomes:
        """`_load_on_each` for a model loaded before; log where it really had to be loaded."""
        outcomes = await self._load_on_each(endpoints)
        for endpoint, result in outcomes:
            if result is True:
                log.info(
                    "model loaded again on a Triton endpoint that had lost it",
                    extra={"model": self._model_name, "url": endpoint.url},
                )
        return outcomes

    def _mark(self, outcomes: LoadOutcomes) -> None:
        """Mark each endpoint by whether it has the model; raise if none has it.

        With no endpoint ready, the most telling failure is raised: a missing model over
        an unreachable server.
        """
        failures = [result for _, result in outcomes if isinstance(result, BaseException)]
        if len(failures) == len(outcomes):
            for kind in (ModelNotFoundError, ModelNotReadyError, BackendUnavailableError):
                for failure in failures:
                    if isinstance(failure, kind):
                        raise failure
            raise failures[0]
        for endpoint, result in outcomes:
            endpoint.healthy = not isinstance(result, BaseException)
            if isinstance(result, BaseException):
                endpoint.detail = f"could not load the model: {result}"
                log.warning(
                    "Triton endpoint could not load the model",
                    extra={"model": self._model_name, "url": endpoint.url, "error": str(result)},
                )

    async def _load_on(self, endpoint: Endpoint) -> bool:
        """Make the model ready on one endpoint; return whether it had to be loaded.

        A model already ready counts as success; otherwise it is loaded through the
        repository API, which needs explicit model-control mode.
        """
        timeout = self._options.control_timeout_s
        try:
            if await self._pool.wait_until_reachable(endpoint):
                return False
            index = await endpoint.stub.RepositoryIndex(
                service_pb2.RepositoryIndexRequest(), metadata=self._pool.metadata, timeout=timeout
            )
            if self._triton_model not in {m.name for m in index.models}:
                raise ModelNotFoundError(
                    self._model_name,
                    f"model {self._triton_model!r} is not in the model repository of Triton "
                    f"at {endpoint.url}",
                )
            await endpoint.stub.RepositoryModelLoad(
                service_pb2.RepositoryModelLoadRequest(model_name=self._triton_model),
                metadata=self._pool.metadata,
                timeout=timeout,
            )
        except grpc.aio.AioRpcError as exc:
            raise self._pool.error(exc, endpoint, Origin.LOAD) from None
        if not await self._pool.model_ready(endpoint, timeout):
            raise ModelNotReadyError(
                f"Triton at {endpoint.url} loaded model {self._triton_model!r}, but version "
                f"{self._options.version or '(default)'} is not ready"
            )
        return True

    async def _unload_on(self, endpoint: Endpoint) -> None:
        timeout = self._options.control_timeout_s
        try:
            await endpoint.stub.RepositoryModelUnload(
                service_pb2.RepositoryModelUnloadRequest(model_name=self._triton_model),
                metadata=self._pool.metadata,
                timeout=timeout,
            )
            # Triton unloads in the background; return once the model is really gone.
            deadline = time.monotonic() + timeout
            while await self._pool.model_ready(endpoint, self._options.health_timeout_s):
                if time.monotonic() > deadline:
                    raise TimeoutError("the model stayed ready")
                await asyncio.sleep(0.05)
        except (grpc.aio.AioRpcError, TimeoutError) as exc:
            message = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            log.warning(
                "Triton did not unload the model",
                extra={"model": self._model_name, "url": endpoint.url, "error": message},
            )

    async def _inspect(self, endpoint: Endpoint, has_tokenizer: bool) -> TritonModelLayout:
        """Read the model's metadata and configuration; pick its convention or refuse it."""
        timeout, version = self._options.control_timeout_s, self._options.version
        try:
            metadata = await endpoint.stub.ModelMetadata(
                service_pb2.ModelMetadataRequest(name=self._triton_model, version=version),
                metadata=self._pool.metadata,
                timeout=timeout,
            )
            config = (
                await endpoint.stub.ModelConfig(
                    service_pb2.ModelConfigRequest(name=self._triton_model, version=version),
                    metadata=self._pool.metadata,
                    timeout=timeout,
                )
            ).config
        except grpc.aio.AioRpcError as exc:
            raise self._pool.error(exc, endpoint, Origin.RPC) from None
        return describe_model(
            metadata,
            config,
            choice=self._options.convention,
            has_tokenizer=has_tokenizer,
            triton_model=self._triton_model,
        )
