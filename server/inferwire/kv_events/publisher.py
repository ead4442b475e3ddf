"""The ZeroMQ side of KV events, in vLLM's wire format as llm-d's subscriber reads it.

One thread owns the sockets: a PUB bound to `server.kv_events.endpoint` sends each batch
as the multipart message `[topic, sequence, payload]` (the sequence 8 bytes big-endian,
one counter for the server, from 0), and an optional ROUTER bound to `replay_endpoint`
answers a DEALER's `["", sequence]` with every buffered batch from that sequence on, each
`["", topic, sequence, payload]`, then the end marker `["", "", 2**64-1, ""]`.

The payload is msgpack of vLLM's `KVEventBatch` as msgspec writes it (array_like, tagged
events): `[ts, [event, ...], data_parallel_rank]` (the rank nil), with events
`["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
lora_name]` (lora_id and medium nil: the engine's own KV; trailing nils left out),
`["BlockRemoved", block_hashes]` and `["AllBlocksCleared"]`.
"""

from __future__ import annotations

import collections
import logging
import queue
import socket
import threading
import time
from typing import Any

from inferwire.core.errors import ConfigurationError
from inferwire.core.kv_blocks import (
    AllBlocksCleared,
    BlockEvent,
    BlockLedger,
    BlockRemoved,
    BlockStored,
    KvEventsSettings,
)

log = logging.getLogger(__name__)

END_OF_REPLAY = (2**64 - 1).to_bytes(8, "big")  # vLLM's END_SEQ, -1 as 8 bytes
_POLL_MS = 20
_LINGER_MS = 1000


def encoded_batch(events: list[BlockEvent], ts: float) -> bytes:
    """vLLM's `KVEventBatch` of `events` as msgpack."""
    import msgpack

    # data_parallel_rank always written (nil: no data parallelism): llm-d's decoder reads
    # the batch as a fixed three-field array and refuses two.
    return bytes(msgpack.packb([ts, [_event(e) for e in events], None]))


def _event(event: BlockEvent) -> list[Any]:
    if isinstance(event, BlockStored):
        fields: list[Any] = [
            "BlockStored",
            list(event.block_hashes),
            event.parent_block_hash,
            list(event.token_ids),
            event.block_size,
        ]
        if event.lora_name is not None:
            fields += [None, None, event.lora_name]
        return fields
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", list(event.block_hashes)]
    assert isinstance(event, AllBlocksCleared)
    return ["AllBlocksCleared"]


class KvEventPublisher:
    """The sockets and their thread; `ledger(model)` gives a model's backend its ledger."""

    def __init__(self, settings: KvEventsSettings) -> None:
        import zmq

        assert settings.endpoint is not None
        self._settings = settings
        self._host = socket.gethostname()
        self._outbox: queue.SimpleQueue[tuple[bytes, bytes] | None] = queue.SimpleQueue()
        self._buffer: collections.deque[tuple[int, bytes, bytes]] = collections.deque(
            maxlen=settings.buffer_batches
        )
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.PUB)
        # On close, what is queued (the unloads' AllBlocksCleared at shutdown) may take
        # this long to go out.
        self._pub.setsockopt(zmq.LINGER, _LINGER_MS)
        self._replay = None
        field, address = "endpoint", settings.endpoint
        try:
            self._pub.bind(address)
            if settings.replay_endpoint is not None:
                self._replay = self._context.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                field, address = "replay_endpoint", settings.replay_endpoint
                self._replay.bind(address)
        except zmq.ZMQError as exc:
            self._close_sockets()
            why = f"server.kv_events.{field}: cannot bind {address}: {exc}"
            raise ConfigurationError(why) from None
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint = (
            self._replay.getsockopt_string(zmq.LAST_ENDPOINT) if self._replay else None
        )
        self._sequence = 0
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        log.info(
            "kv events publishing",
            extra={"endpoint": self.endpoint, "replay_endpoint": self.replay_endpoint},
        )

    def ledger(self, model: str) -> BlockLedger:
        topic = self._settings.topic_of(self._host, model).encode()

        def publish(events: list[BlockEvent]) -> None:
            self._outbox.put((topic, encoded_batch(events, time.time())))

        return BlockLedger(publish)

    def close(self) -> None:
        """Send what is queued, then close the sockets."""
        self._outbox.put(None)
        self._thread.join(timeout=5)

    # ---- the thread ------------------------------------------------------

    def _run(self) -> None:
        import zmq

        poller = zmq.Poller()
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        try:
            while self._send_queued():
                if self._replay is None:
                    item = self._outbox.get()
                    if item is None:
                        return
                    self._send(*item)
                    continue
                if dict(poller.poll(_POLL_MS)):
                    self._answer_replay()
        except Exception:
            log.exception("kv events thread failed")
        finally:
            self._close_sockets()

    def _send_queued(self) -> bool:
        """Send every batch queued; False once closing."""
        while True:
            try:
                item = self._outbox.get_nowait()
            except queue.Empty:
                return True
            if item is None:
                return False
            self._send(*item)

    def _send(self, topic: bytes, payload: bytes) -> None:
        sequence = self._sequence
        self._sequence += 1
        self._buffer.append((sequence, topic, payload))
        self._pub.send_multipart((topic, sequence.to_bytes(8, "big"), payload))

    def _answer_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("kv events: a malformed replay request", extra={"frames": len(frames)})
            return
        client, start = frames[0], int.from_bytes(frames[2], "big")
        for sequence, topic, payload in list(self._buffer):
            if sequence >= start:
                self._replay.send_multipart(
                    (client, b"", topic, sequence.to_bytes(8, "big"), payload)
                )
        self._replay.send_multipart((client, b"", b"", END_OF_REPLAY, b""))

    def _close_sockets(self) -> None:
        self._pub.close()
        if self._replay is not None:
            self._replay.close()
        self._context.term()
