"""The Responses API's stored responses: in memory, a bounded store per model, each
response readable by the tenant that made it and no other.

A response made with `store: true` (OpenAI's default) is kept with the conversation it
ends: the conversation it continued (`previous_response_id`), its own input and its
output, which a later request's `previous_response_id` prepends to that request's input.
Each model's store holds at most `server.responses.max_entries` responses and
`max_bytes` bytes (a response counted as its JSON and the text of its whole
conversation); past either bound the oldest go first. A response larger than
`max_bytes` alone is not stored. Another tenant's response is absent, to the same
answer as one never made or evicted: a store never tells that an id exists.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from inferwire.core.chat import ChatMessage

# A stored entry's own overhead (ids, the objects that hold it), so that a store of
# empty responses is bounded in bytes too.
ENTRY_OVERHEAD_BYTES = 256


def conversation_bytes(messages: Iterable[ChatMessage]) -> int:
    """What a conversation's text takes, in UTF-8 bytes."""
    total = 0
    for message in messages:
        total += len(message.content.encode()) + len(message.tool_call_id)
        total += sum(
            len(c.id) + len(c.name) + len(c.arguments.encode()) for c in message.tool_calls
        )
    return total


@dataclass(frozen=True)
class StoredResponse:
    """A response as GET answers it (`body`, its JSON) and the conversation it ends."""

    id: str
    model: str
    tenant: str
    body: bytes
    conversation: tuple[ChatMessage, ...]
    size: int = field(init=False)

    def __post_init__(self) -> None:
        size = ENTRY_OVERHEAD_BYTES + len(self.body) + conversation_bytes(self.conversation)
        object.__setattr__(self, "size", size)

    def call_ids(self) -> set[str]:
        """The ids of the calls its conversation made (a `function_call_output` may
        answer them)."""
        return {call.id for message in self.conversation for call in message.tool_calls}


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


class ResponseStore:
    """Every model's stored responses, each store bounded in entries and bytes."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._models: dict[str, _ModelStore] = {}
        self._model_of: dict[str, str] = {}  # response id -> its model

    def put(self, response: StoredResponse) -> list[str]:
        """Store `response`; the ids evicted to make room for it (its own if it is
        larger than a store may hold)."""
        if response.size > self.max_bytes or self.max_entries == 0:
            return [response.id]
        store = self._models.setdefault(response.model, _ModelStore())
        evicted = []
        while store.entries and (
            len(store.entries) >= self.max_entries or store.bytes + response.size > self.max_bytes
        ):
            evicted.append(self._forget(store, store.oldest()))
        store.add(response)
        self._model_of[response.id] = response.model
        return evicted

    def get(self, response_id: str, tenant: str) -> StoredResponse | None:
        """The response `response_id` if it is stored and `tenant`'s; else None."""
        model = self._model_of.get(response_id)
        if model is None:
            return None
        response = self._models[model].entries[response_id]
        return response if response.tenant == tenant else None

    def delete(self, response_id: str, tenant: str) -> bool:
        """Forget `tenant`'s response `response_id`; False if there is none such."""
        response = self.get(response_id, tenant)
        if response is None:
            return False
        self._forget(self._models[response.model], response_id)
        return True

    def usage(self) -> dict[str, tuple[int, int]]:
        """Each model's stored responses and their bytes."""
        return {model: (len(s.entries), s.bytes) for model, s in self._models.items()}

    def _forget(self, store: _ModelStore, response_id: str) -> str:
        store.pop(response_id)
        del self._model_of[response_id]
        return response_id
