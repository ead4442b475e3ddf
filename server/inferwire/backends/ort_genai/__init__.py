"""The embedded ONNX Runtime GenAI backend (the default).

Modules:

- `backend.py`: the `Backend` (options, load, facts, health, chat, Tokenize): loads the
  model on its path and hands each request to it; `options.py` its options.
- `continuous/`: the CPU path (`batching: auto` on the CPU, or `continuous`): the folder's
  ONNX graph run by ONNX Runtime itself, one KV slot per request, every request in one
  step loop's steps, with inferwire's own sampler, log-probabilities, llguidance
  constraints and LoRA weights (decoder.py, loop.py, sampler.py, guidance.py, model.py).
- `og_paths.py`: ONNX Runtime GenAI's own objects, the path on CUDA (or when asked):
  `generator.py`, one `og.Generator` per request in a thread; `engine.py`, one `og.Engine`
  batching requests, driven by one thread (`engine_process.py`, `engine_host.py`: that
  thread in a process of its own); `model.py`, `LoadedModel`, read at load, and the
  helpers both paths share; `sampling.py`, `SearchOptions`, the mapping of
  GenerationParams onto ORT GenAI's search options; `logprobs.py`, log-probabilities from
  a generator's logits.
- `adapter.py`: LoRA adapter models on a base model of this backend, on either path.
- `inferwire.backends.threaded` (shared with the llama.cpp backend): the step-loop frame
  and the hand-over of text from the generating threads to the event loops.
"""

from inferwire.backends.ort_genai.backend import (
    BUILTIN_MODEL,
    OrtGenAIBackend,
    OrtGenAIOptions,
    builtin_model_path,
)

__all__ = ["BUILTIN_MODEL", "OrtGenAIBackend", "OrtGenAIOptions", "builtin_model_path"]
