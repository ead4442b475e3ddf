"""KV events: a model's prefix-cache blocks as they are stored, removed and cleared,
published over ZeroMQ in vLLM's wire format (msgpack `KVEventBatch`) for llm-d's precise
prefix-cache scorer (`server.kv_events`; docs/deployment.md). publisher.py is the
sockets, imported only when an endpoint is set; the settings, and the ledger a backend
reports its blocks to, are core/kv_blocks.py's."""
