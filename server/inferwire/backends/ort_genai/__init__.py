"""The embedded ONNX Runtime GenAI backend (the default).

Modules:

- `backend.py`: the `Backend` (options, load, health, chat, Tokenize); prepares each
  request (tokenize, check it fits, map its sampling) and hands it to one path.
- `model.py`: `LoadedModel`, the engine objects and configuration read at load.
- `sampling.py`: `SearchOptions`, the one mapping of GenerationParams onto ORT GenAI's
  sampling options for both paths, and `PathRequest`, what a path is handed.
- `generator.py`: the per-request path, one `og.Generator` per request in a thread.
- `engine.py`: the engine path, one `og.Engine` batching requests, driven by one thread.
- `inferwire.backends.threaded` (shared with the llama.cpp backend): the hand-over of
  text from the generating threads to the event loops (`delivery.Outbox`) and the
  consumer's loop, channel and token counting (`consumer`).
- `logprobs.py`: log-probabilities from the generator's logits.
"""

from inferwire.backends.ort_genai.backend import (
    BUILTIN_MODEL,
    OrtGenAIBackend,
    OrtGenAIOptions,
    builtin_model_path,
)

__all__ = ["BUILTIN_MODEL", "OrtGenAIBackend", "OrtGenAIOptions", "builtin_model_path"]
