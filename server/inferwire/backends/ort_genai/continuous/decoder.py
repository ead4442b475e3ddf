"""An ORT GenAI folder's decoder run by ONNX Runtime itself, with one KV slot per row.

The folder's `model.onnx` (the model builder's export: GroupQueryAttention, int4 or fp32
MatMuls) takes `input_ids` [batch, sequence], `attention_mask` [batch, total] and each
layer's past key and value, and returns the logits and the present key and value. With
`past_present_share_buffer` (the builder's CPU exports) past and present are one buffer
of a fixed capacity, and each row's length is its attention mask's ones: GQA writes a
row's new keys at its own length and attends to its own prefix, so rows of different
lengths step together and a row's logits do not depend on its batch-mates (checked
bit for bit: tests/engine/test_continuous.py). The session runs the graph with its LM head
on each row's last two positions only (head.py): a prefill's logits are its last ones.

`KvSlots` holds, per layer, a key and a value buffer [slots, kv_heads, slot_tokens,
head_size]; a row is one slot, and rows 0..n-1 of every buffer are one contiguous view,
so a decode step of n rows binds those views (made once per n and kept). A prefill binds
one row. Rows move (`move`, `swap`) by copying their filled positions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from inferwire.backends.ort_genai.continuous.head import sliced_head
from inferwire.core.errors import ConfigurationError

Logits = npt.NDArray[np.float32]
# ONNX Runtime's CPU kernels take another path for a one-row step than for several (on an
# AVX2 EPYC, SmolLM2 int4: a logit moved by 0.64), while rows of steps of two or more
# rows agree bit for bit. So a row that must not depend on other traffic (a seeded one)
# never steps alone: the loop adds a shadow row.
MIN_DECODE_ROWS = 2
# Where a graph loaded from memory (head.py's) finds its external data.
_EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"


@dataclass(frozen=True)
class DecoderLayout:
    """The decoder's shape and its inputs' and outputs' names, from genai_config.json."""

    layers: int
    kv_heads: int
    head_size: int
    vocab_size: int
    input_ids: str
    attention_mask: str
    logits: str
    past: tuple[str, ...]  # per layer: key, then value
    present: tuple[str, ...]

    @classmethod
    def of(cls, config: dict[str, Any]) -> DecoderLayout:
        model = config["model"]
        decoder = model["decoder"]
        inputs, outputs = decoder.get("inputs", {}), decoder.get("outputs", {})
        heads = int(decoder["num_attention_heads"])
        layers = int(decoder["num_hidden_layers"])

        def per_layer(names: dict[str, str], kind: str, default: str) -> tuple[str, ...]:
            keys = names.get(f"{kind}_key_names", f"{default}.%d.key")
            values = names.get(f"{kind}_value_names", f"{default}.%d.value")
            return tuple(name for i in range(layers) for name in (keys % i, values % i))

        return cls(
            layers=layers,
            kv_heads=int(decoder.get("num_key_value_heads") or heads),
            head_size=int(decoder.get("head_size") or int(decoder["hidden_size"]) // heads),
            vocab_size=int(model["vocab_size"]),
            input_ids=inputs.get("input_ids", "input_ids"),
            attention_mask=inputs.get("attention_mask", "attention_mask"),
            logits=outputs.get("logits", "logits"),
            past=per_layer(inputs, "past", "past_key_values"),
            present=per_layer(outputs, "present", "present"),
        )

    def kv_bytes_per_token(self, dtype: np.dtype[Any]) -> int:
        return 2 * self.layers * self.kv_heads * self.head_size * dtype.itemsize


class KvSlots:
    """Every layer's key and value cache, one slot per row (see the module's docstring)."""

    def __init__(
        self, layout: DecoderLayout, slots: int, slot_tokens: int, dtype: np.dtype[Any]
    ) -> None:
        self.slots, self.slot_tokens = slots, slot_tokens
        shape = (slots, layout.kv_heads, slot_tokens, layout.head_size)
        self.buffers = [np.zeros(shape, dtype) for _ in layout.past]
        self.nbytes = sum(buffer.nbytes for buffer in self.buffers)

    def views(self, start: int, stop: int) -> list[ort.OrtValue]:
        """OrtValues over rows start..stop-1 of every buffer (sharing their memory)."""
        return [ort.OrtValue.ortvalue_from_numpy(b[start:stop]) for b in self.buffers]

    def move(self, source: int, target: int, length: int) -> None:
        """Row `target` holds row `source`'s first `length` positions."""
        if source != target and length:
            for buffer in self.buffers:
                buffer[target, :, :length] = buffer[source, :, :length]

    def write(self, row: int, positions: list[npt.NDArray[Any]]) -> None:
        """Row `row` holds `positions`, one [heads, length, head_size] per buffer (in
        DecoderLayout.past's order), as its first positions."""
        for buffer, held in zip(self.buffers, positions, strict=True):
            buffer[row, :, : held.shape[1]] = held

    def swap(self, a: int, b: int, length_a: int, length_b: int) -> None:
        """Rows `a` and `b` trade their filled positions."""
        if a == b:
            return
        longest = max(length_a, length_b)
        for buffer in self.buffers:
            held = buffer[a, :, :longest].copy()
            buffer[a, :, :length_b] = buffer[b, :, :length_b]
            buffer[b, :, :length_a] = held[:, :length_a]


class Decoder:
    """The session and its KV slots; `prefill` and `decode` are the two runs a step makes.
    Used by one thread (the step loop's)."""

    min_exact_rows = MIN_DECODE_ROWS  # the fewest rows a seeded row steps among

    def __init__(
        self,
        path: Path,
        config: dict[str, Any],
        threads: int,
        slots: int,
        slot_tokens: int,
        head_on_last_positions: bool = True,  # False: the graph as exported (benchmarks)
    ) -> None:
        self.layout = layout = DecoderLayout.of(config)
        self.threads = threads
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Between steps the thread samples in Python: spinning workers would take the core.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3  # a LoRA input's "initializer in graph inputs" notes
        filename = config["model"]["decoder"].get("filename", "model.onnx")
        try:
            graph: str | bytes = str(path / filename)
            sliced = sliced_head(path / filename, layout.logits) if head_on_last_positions else None
            if sliced is not None:
                # The file's own folder, links resolved: ONNX Runtime refuses external data
                # that resolves outside the folder it is given.
                folder = (path / filename).resolve().parent
                options.add_session_config_entry(_EXTERNAL_DATA_FOLDER, str(folder))
                graph = sliced
            self.session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnx and onnxruntime raise their own error types
            message = f"{path / filename}: ONNX Runtime cannot load it: {exc}"
            raise ConfigurationError(message) from None
        types = {i.name: i.type for i in self.session.get_inputs()}
        missing = [name for name in (*layout.past, layout.input_ids) if name not in types]
        if missing:
            raise ConfigurationError(f"{path / filename} has no input {missing[0]!r}")
        dtype = np.dtype(np.float16 if types[layout.past[0]] == "tensor(float16)" else np.float32)
        # A spare row after the slots: the shadow of a lone row in the last slot (loop.py).
        self.kv = KvSlots(layout, slots + 1, slot_tokens, dtype)
        self.kv_dtype = dtype
        # An adapter-ready export takes each LoRA weight as an input with a zero default
        # (ONNX Runtime lists those among its overridable initializers).
        overridable = {i.name for i in self.session.get_overridable_initializers()}
        self.adapter_inputs = frozenset(n for n in {*types, *overridable} if ".lora_" in n)
        # Each adapter's LoRA weights, bound as the graph's inputs: run_with_iobinding does
        # not apply RunOptions' active adapters (ONNX Runtime 1.32, checked).
        self._adapters: dict[str, dict[str, ort.OrtValue]] = {}
        self._decode_bindings: dict[tuple[int, int, str], tuple[ort.IOBinding, Logits]] = {}

    def kv_bytes_per_token(self) -> int:
        return self.layout.kv_bytes_per_token(self.kv_dtype)

    def add_adapter(self, key: str, file: Path) -> None:
        """Read a LoRA adapter file (ONNX Runtime's AdapterFormat) as `key`'s weights; a
        parameter the graph does not take is refused."""
        parameters = ort.AdapterFormat.read_adapter(str(file)).get_parameters()
        unknown = sorted(set(parameters) - self.adapter_inputs)
        if unknown:
            raise ValueError(f"the model has no input {unknown[0]!r} ({len(unknown)} unknown)")
        self._adapters[key] = dict(parameters)

    def probe(self, adapter: str) -> None:
        """One token read under `adapter`, apart from the slots (ONNX Runtime's runs may
        overlap the step loop's): weights of the wrong shapes fail here."""
        layout = self.layout
        empty = np.zeros((1, layout.kv_heads, 0, layout.head_size), self.kv_dtype)
        feeds: dict[str, Any] = {name: empty for name in layout.past}
        feeds[layout.input_ids] = np.zeros((1, 1), np.int64)
        feeds[layout.attention_mask] = np.ones((1, 1), np.int64)
        feeds.update({name: value.numpy() for name, value in self._adapters[adapter].items()})
        self.session.run([layout.logits], feeds)

    def remove_adapter(self, key: str) -> None:
        """Once no request of `key` is in flight: its weights and bindings go."""
        self._adapters.pop(key, None)
        for binding_key in [k for k in list(self._decode_bindings) if k[2] == key]:
            self._decode_bindings.pop(binding_key, None)

    def prefill(self, row: int, tokens: list[int], past: int, adapter: str = "") -> Logits:
        """Read `tokens` into row `row` after its first `past` positions, under `adapter`
        ("" for none); the logits of the last one."""
        binding = self.session.io_binding()
        self._bind_adapter(binding, adapter)
        ids = np.array([tokens], dtype=np.int64)
        binding.bind_cpu_input(self.layout.input_ids, ids)
        mask = np.ones((1, past + len(tokens)), dtype=np.int64)
        binding.bind_cpu_input(self.layout.attention_mask, mask)
        self._bind_kv(binding, self.kv.views(row, row + 1))
        binding.bind_output(self.layout.logits)
        self.session.run_with_iobinding(binding)
        logits: Logits = binding.get_outputs()[-1].numpy()[0, -1]
        return logits

    def decode(
        self,
        tokens: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
        adapter: str = "",
        first: int = 0,
    ) -> Logits:
        """One token for each of rows first..first+n-1 (`tokens`), each after its own
        `lengths` positions, under `adapter`; their logits [n, vocab] (valid until the next
        decode)."""
        count = len(tokens)
        binding, logits = self._decode_binding(first, count, adapter)
        binding.bind_cpu_input(self.layout.input_ids, tokens.reshape(count, 1))
        total = int(lengths.max()) + 1
        mask = (np.arange(total)[None, :] <= lengths[:, None]).astype(np.int64)
        binding.bind_cpu_input(self.layout.attention_mask, mask)
        self.session.run_with_iobinding(binding)
        return logits[:, 0]

    def _decode_binding(self, first: int, count: int, adapter: str) -> tuple[ort.IOBinding, Logits]:
        key = (first, count, adapter)
        found = self._decode_bindings.get(key)
        if found is None:
            binding = self.session.io_binding()
            self._bind_adapter(binding, adapter)
            self._bind_kv(binding, self.kv.views(first, first + count))
            logits = np.zeros((count, 1, self.layout.vocab_size), dtype=np.float32)
            binding.bind_ortvalue_output(
                self.layout.logits, ort.OrtValue.ortvalue_from_numpy(logits)
            )
            found = self._decode_bindings[key] = (binding, logits)
        return found

    def _bind_adapter(self, binding: ort.IOBinding, adapter: str) -> None:
        for name, value in self._adapters[adapter].items() if adapter else ():
            binding.bind_ortvalue_input(name, value)

    def _bind_kv(self, binding: ort.IOBinding, views: list[ort.OrtValue]) -> None:
        for past, present, view in zip(self.layout.past, self.layout.present, views, strict=True):
            binding.bind_ortvalue_input(past, view)
            binding.bind_ortvalue_output(present, view)


def shares_buffer(config: dict[str, Any]) -> bool:
    """Whether the export's past and present are one buffer (what this path runs)."""
    return bool(config.get("search", {}).get("past_present_share_buffer", False))


def read_layout(path: Path) -> DecoderLayout:
    """The layout of the folder at `path` (for estimates made before loading)."""
    return DecoderLayout.of(json.loads((path / "genai_config.json").read_text()))
