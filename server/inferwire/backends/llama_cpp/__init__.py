"""The embedded llama.cpp backend (`backend: llama-cpp`): a GGUF file served in-process,
continuous batching and a prompt cache per slot, on the CPU.

Modules:

- `backend.py`: the `Backend` (options, load, health, chat, Tokenize); prepares each
  request and hands it to the step loop.
- `model.py`: `GgufModel`, the file loaded through llama-cpp-python's ctypes bindings, and
  its context.
- `sampling.py`: a request's sampling as a llama.cpp sampler chain.
- `step_loop.py`: the thread that runs every request's next token in one decode step,
  and the slots whose KV streams keep a finished request's tokens for the next turn.
- `step_plan.py`: what one step computes (next tokens, prompt chunks first come first
  served, rows in slot order); no llama.cpp import, so it is unit-tested without it.
- `saved_prompts.py`: conversations saved from the slots to host memory.

Nothing is imported here: the registry imports `backend.py`, and `step_plan.py` can be
imported where llama-cpp-python is not installed.
"""
