"""What every store of responses shares: a stored response, how it is counted and written,
and the interface (`ResponseStore`) the routes call.

A response made with `store: true` (OpenAI's default) is kept with the conversation it
ends: the conversation it continued (`previous_response_id`), its own input and its
output, which a later request's `previous_response_id` prepends to that request's input.
Each model's responses are at most `server.responses.max_entries` and `max_bytes` bytes
(a response counted as its JSON and the text of its whole conversation); past either
bound the oldest go first. A response larger than `max_bytes` alone is not stored.
Another tenant's response is absent, to the same answer as one never made or evicted: a
store never tells that an id exists.
"""

from __future__ import annotations

import abc
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from inferwire.core.chat import ChatMessage, ToolCall
from inferwire.core.errors import StoreUnavailableError

log = logging.getLogger(__name__)

# A stored entry's own overhead (ids, the objects or row that hold it), so that a store of
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


def conversation_json(conversation: Iterable[ChatMessage]) -> str:
    """A conversation as JSON text, as a database stores it."""
    turns: list[dict[str, Any]] = []
    for message in conversation:
        turn: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.tool_calls:
            turn["tool_calls"] = [[c.id, c.name, c.arguments] for c in message.tool_calls]
        if message.tool_call_id:
            turn["tool_call_id"] = message.tool_call_id
        turns.append(turn)
    return json.dumps(turns, ensure_ascii=False, separators=(",", ":"))


def conversation_of(text: str) -> tuple[ChatMessage, ...]:
    """The conversation `conversation_json` wrote."""
    return tuple(
        ChatMessage(
            turn["role"],
            turn["content"],
            tuple(ToolCall(*call) for call in turn.get("tool_calls", ())),
            turn.get("tool_call_id", ""),
        )
        for turn in json.loads(text)
    )


class ResponseStore(abc.ABC):
    """Every model's stored responses, bounded per model in entries and bytes, each
    response its tenant's. Reads and writes raise StoreUnavailableError when the store
    cannot be reached (a database gone); `usage` never does."""

    name: str  # how answers and logs name the store: `memory`, `sqlite:///…`, `postgresql://…`

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes

    async def put(self, response: StoredResponse) -> list[str]:
        """Store `response` (kept when this returns); the ids evicted to make room for it
        (its own if it is larger than a store may hold)."""
        if response.size > self.max_bytes or self.max_entries == 0:
            return [response.id]
        return await self._put(response)

    @abc.abstractmethod
    async def _put(self, response: StoredResponse) -> list[str]:
        """Store `response`, which fits alone, evicting the model's oldest until it fits."""

    @abc.abstractmethod
    async def get(self, response_id: str, tenant: str) -> StoredResponse | None:
        """The response `response_id` if it is stored and `tenant`'s; else None."""

    @abc.abstractmethod
    async def delete(self, response_id: str, tenant: str) -> bool:
        """Forget `tenant`'s response `response_id`; False if there is none such."""

    @abc.abstractmethod
    def usage(self) -> dict[str, tuple[int, int]]:
        """Each model's stored responses and their bytes, as this process last saw them
        (a database shared by replicas changes under it)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Let go of the store's connections and threads."""

    def unavailable(self, error: BaseException) -> StoreUnavailableError:
        """The caller's answer to `error` of the store's database: 503 naming the store
        and the first line of why; the whole error is logged."""
        why = (str(error).strip().splitlines() or [type(error).__name__])[0]
        log.warning(
            "the Responses store is unavailable",
            extra={"store": self.name, "error": f"{type(error).__name__}: {error}"},
        )
        return StoreUnavailableError(f"the Responses store {self.name} is unavailable: {why}")
