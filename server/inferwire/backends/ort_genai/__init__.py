"""The embedded ONNX Runtime GenAI backend (the default).

Modules:

- `backend.py`: the `Backend` (options, load, health, chat, Tokenize); prepares each
  request (tokenize, check it fits, map its sampling) and hands it to one path.
- `model.py`: `LoadedModel`, the engine objects and configuration read at load.
- `sampling.py`: `Sampling`, the one mapping of GenerationParams onto ORT GenAI's
  sampling options for both paths, and `PreparedRequest`, what a path is handed.
- `generator.py`: the per-request path, one `og.Generator` per request in a thread.
- `engine.py`: the engine path, one `og.Engine` batching requests, driven by one thread.
- `delivery.py`: both paths' hand-over of text from their threads to the event loops, at
  most once per `stream_interval_ms` (`Outbox`).
- `consumer.py`: what both paths share: the consumer's loop (coalescing, flow control,
  cancel on close), the channel it reads, and the counting of tokens (`TokenTally`).
- `logprobs.py`: log-probabilities from the generator's logits.
"""

from inferwire.backends.ort_genai.backend import (
    BUILTIN_MODEL,
    OrtGenAIBackend,
    OrtGenAIOptions,
    builtin_model_path,
)

__all__ = ["BUILTIN_MODEL", "OrtGenAIBackend", "OrtGenAIOptions", "builtin_model_path"]
