"""What the in-process engines share: a thread generates, the event loop consumes.

- `step_loop.py`: the frame of every batching engine (`StepLoop`: the inbox, the command
  switch, the failure path; `SlotStepLoop`: requests that each hold a KV slot);
- `shared_thread.py`: one request on a shared thread, and the hand-over of its items;
- `delivery.py`: the hand-over of items from a generating thread to the event loops of
  their consumers, at most once per `stream_interval_ms` unless urgent;
- `consumer.py`: the consumer's side of a request's events (coalescing, flow control,
  cancel on close) and the counting of its tokens.

Used by the onnxruntime-genai backend's paths and by the llama.cpp backend.
"""
