"""`server.responses.store: memory`: the stored responses in this process's memory, lost
on restart and seen by no other replica."""

from __future__ import annotations

from collections import OrderedDict

from inferwire.http.responses_api.store.base import ResponseStore, StoredResponse


class _ModelStore:
    """One model's responses, oldest first."""

    def __init__(self) -> None:
        self.entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.bytes = 0

    def add(self, response: StoredResponse) -> None:
        self.entries[response.id] = response
        self.bytes += response.size

    def pop(self, response_id: str) -> StoredResponse:
        response = self.entries.pop(response_id)
        self.bytes -= response.size
        return response

    def oldest(self) -> str:
        return next(iter(self.entries))


class MemoryStore(ResponseStore):
    """Every model's stored responses in dictionaries; never unavailable."""

    name = "memory"

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        super().__init__(max_entries, max_bytes)
        self._models: dict[str, _ModelStore] = {}
        self._model_of: dict[str, str] = {}  # response id -> its model

    async def _put(self, response: StoredResponse) -> list[str]:
        store = self._models.setdefault(response.model, _ModelStore())
        evicted = []
        while store.entries and (
            len(store.entries) >= self.max_entries or store.bytes + response.size > self.max_bytes
        ):
            evicted.append(self._forget(store, store.oldest()))
        store.add(response)
        self._model_of[response.id] = response.model
        return evicted

    async def get(self, response_id: str, tenant: str) -> StoredResponse | None:
        model = self._model_of.get(response_id)
        if model is None:
            return None
        response = self._models[model].entries[response_id]
        return response if response.tenant == tenant else None

    async def delete(self, response_id: str, tenant: str) -> bool:
        response = await self.get(response_id, tenant)
        if response is None:
            return False
        self._forget(self._models[response.model], response_id)
        return True

    def usage(self) -> dict[str, tuple[int, int]]:
        return {model: (len(s.entries), s.bytes) for model, s in self._models.items()}

    async def close(self) -> None:
        pass  # nothing is held but memory

    def _forget(self, store: _ModelStore, response_id: str) -> str:
        store.pop(response_id)
        del self._model_of[response_id]
        return response_id
