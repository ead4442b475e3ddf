"""A GGUF file loaded by llama.cpp (through llama-cpp-python's ctypes bindings): the model,
its vocabulary and one context whose KV cache holds a stream per slot.

llama.cpp's calls are C calls through ctypes, which releases the GIL while they run: a
decode step on the step loop's thread leaves the event loop free. Tokenizing and
detokenizing are quick and thread-safe on the vocabulary, so the event loop calls them
directly.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as llama

from inferwire.core.errors import ConfigurationError

log = logging.getLogger(__name__)
_GGML_LOG_WARN, _GGML_LOG_ERROR = 3, 4  # ggml.h, enum ggml_log_level


@llama.llama_log_callback
def _llama_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp logs some 900 lines at INFO for one load; only warnings and errors are
    # worth an operator's time, and they go through the server's logging.
    if level in (_GGML_LOG_WARN, _GGML_LOG_ERROR):
        message = text.decode("utf-8", errors="replace").rstrip()
        log.log(logging.ERROR if level == _GGML_LOG_ERROR else logging.WARNING, message)


_backend_ready = threading.Lock()
_backend_initialised = False


def _init_backend() -> None:
    global _backend_initialised
    with _backend_ready:
        if not _backend_initialised:
            llama.llama_log_set(_llama_log, ctypes.c_void_p(0))
            llama.llama_backend_init()
            _backend_initialised = True


@dataclass(frozen=True)
class ContextShape:
    """How the context is made: one KV stream of `slot_tokens` per slot."""

    slots: int
    slot_tokens: int
    threads: int
    batch_tokens: int  # the most tokens one decode step takes (prefill chunks included)
    prefill_tokens: int  # the most prompt tokens one step reads, oldest request first


class GgufModel:
    """The model and vocabulary of one GGUF file; `new_context` makes its context."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise ConfigurationError(f"options.path: {path} is not a GGUF file")
        _init_backend()
        params = llama.llama_model_default_params()
        params.n_gpu_layers = 0  # this backend runs on the CPU
        model = llama.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise ConfigurationError(f"options.path: llama.cpp could not load {path}")
        self.path = path
        self.model = model
        self.vocab = llama.llama_model_get_vocab(model)
        self.vocab_size = int(llama.llama_vocab_n_tokens(self.vocab))
        self.train_context = int(llama.llama_model_n_ctx_train(model))
        self.size_bytes = int(llama.llama_model_size(model))
        self.eog_tokens = frozenset(
            token for token in range(self.vocab_size) if llama.llama_vocab_is_eog(self.vocab, token)
        )
        # Read once: every ListModels and metrics scrape multiplies cached tokens by it.
        self.kv_bytes_per_token = self._kv_bytes_per_token()

    def close(self) -> None:
        llama.llama_model_free(self.model)

    def metadata(self, key: str) -> str | None:
        size = llama.llama_model_meta_val_str(self.model, key.encode(), None, 0)
        if size < 0:
            return None
        buffer = ctypes.create_string_buffer(size + 1)
        llama.llama_model_meta_val_str(self.model, key.encode(), buffer, size + 1)
        return buffer.value.decode("utf-8", errors="replace")

    def token_text(self, token: int) -> str:
        """A token's text as the template refers to it (bos_token, eos_token)."""
        if token < 0:
            return ""
        return self.piece(token, special=True).decode("utf-8", errors="replace")

    @property
    def bos_token(self) -> int:
        return int(llama.llama_vocab_bos(self.vocab))

    @property
    def eos_token(self) -> int:
        return int(llama.llama_vocab_eos(self.vocab))

    def tokenize(self, text: str) -> list[int]:
        """As llama-server tokenizes a prompt: special tokens added and parsed."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            tokens = (llama.llama_token * capacity)()
            count = llama.llama_tokenize(self.vocab, data, len(data), tokens, capacity, True, True)
            if count >= 0:
                return list(tokens[:count])
            capacity = -count

    def piece(self, token: int, special: bool = False) -> bytes:
        buffer = ctypes.create_string_buffer(64)
        count = llama.llama_token_to_piece(self.vocab, token, buffer, 64, 0, special)
        if count < 0:
            buffer = ctypes.create_string_buffer(-count)
            count = llama.llama_token_to_piece(self.vocab, token, buffer, -count, 0, special)
        return buffer.raw[:count]

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(token) for token in tokens).decode("utf-8", errors="replace")

    def _kv_bytes_per_token(self) -> int:
        """K and V in f16 for every layer: what one cached token costs."""
        layers = int(self._int_metadata("block_count"))
        heads = self._int_metadata("attention.head_count")
        kv_heads = self._int_metadata("attention.head_count_kv") or heads
        width = self._int_metadata("embedding_length")
        return 2 * layers * kv_heads * (width // max(heads, 1)) * 2

    def _int_metadata(self, key: str) -> int:
        architecture = self.metadata("general.architecture") or ""
        value = self.metadata(f"{architecture}.{key}")
        try:
            return int(value) if value is not None else 0
        except ValueError:
            return 0

    def new_context(self, shape: ContextShape) -> llama.llama_context_p:
        params = llama.llama_context_default_params()
        params.n_ctx = shape.slots * shape.slot_tokens
        params.n_seq_max = shape.slots
        params.n_batch = shape.batch_tokens
        params.n_ubatch = min(shape.batch_tokens, 512)
        params.n_threads = shape.threads
        params.n_threads_batch = shape.threads
        # One KV stream per slot, as llama-server makes it for a fixed number of slots: a
        # slot's attention reads its own stream only, and its cached prompt stays there.
        params.kv_unified = False
        params.no_perf = True
        context = llama.llama_init_from_model(self.model, params)
        if not context:
            raise ConfigurationError(
                f"llama.cpp could not make a context of {shape.slots} slots x "
                f"{shape.slot_tokens} tokens for {self.path}"
            )
        return context
