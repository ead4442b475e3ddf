"""What the in-process engines share: a thread generates, the event loop consumes.

- `delivery.py`: the hand-over of items from a generating thread to the event loops of
  their consumers, at most once per `stream_interval_ms` unless urgent;
- `consumer.py`: the consumer's side of a request's events (coalescing, flow control,
  cancel on close) and the counting of its tokens.

Used by the onnxruntime-genai backend's two paths and by the llama.cpp backend.
"""
