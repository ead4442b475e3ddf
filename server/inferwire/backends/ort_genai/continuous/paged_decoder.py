"""The continuous path's decoder on OpenVINO's kernels (`kernels: openvino`): the GGUF the
model folder was imported from, converted by OpenVINO GenAI (its Q4_1 weights stay u4)
and turned into the paged-attention model its ContinuousBatchingPipeline runs
(openvino's `paged_attention_transformation`). The loop (loop.py) drives it through the
same calls as decoder.py's ONNX Runtime one; tokenizer, template, constraints and
sampling stay the loop's.

The model takes every row's new tokens flat (`input_ids`, `position_ids`), each row's
`past_lens`, where each row's tokens begin (`subsequence_begins`) and its KV blocks
(`block_indices`, `block_indices_begins`); each layer's `key_cache.N` / `value_cache.N`
is one tensor of blocks of `BLOCK_TOKENS` positions (f32 here). A row owns a run of
blocks through `PagedKv.tables`, so packing rows (`swap`) trades two tables and copies
nothing; `move` copies whole blocks.

Measured against decoder.py on one thread of an AMX Xeon (bench/openvino_decoder.py): a
prefill and steps of 8 or more rows take 0.5-0.75 of its CPU, one row 1.35x. Compute is
f32 (the plugin's bf16 default on such CPUs rounds a row differently in a batch than
alone: 8 of 640 argmaxes), so a row's logits do not depend on its batch-mates, and a
prompt read in chunks gives the logits of the prompt read at once (tested). They do depend
on the thread count: SmolLM2's greedy text on one thread and on two parts at the 10th token.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from inferwire.backends.ort_genai.continuous.decoder import DecoderLayout
from inferwire.core.errors import ConfigurationError

Logits = npt.NDArray[np.float32]
BLOCK_TOKENS = 32  # the CPU plugin's paged-attention block
_CACHES = ("key_cache.", "value_cache.")


class PagedKv:
    """Every layer's KV blocks and each row's run of them (see the module's docstring)."""

    def __init__(self, caches: list[npt.NDArray[Any]], rows: int, row_blocks: int) -> None:
        self._caches, self.row_blocks = caches, row_blocks
        self.tables = [
            np.arange(r * row_blocks, (r + 1) * row_blocks, dtype=np.int32) for r in range(rows)
        ]
        self.nbytes = sum(cache.nbytes for cache in caches)

    def move(self, source: int, target: int, length: int) -> None:
        """Row `target` holds row `source`'s first `length` positions."""
        blocks = -(-length // BLOCK_TOKENS)
        if source == target or not blocks:
            return
        origin, destination = self.tables[source][:blocks], self.tables[target][:blocks]
        for cache in self._caches:
            cache[destination] = cache[origin]

    def swap(self, a: int, b: int, length_a: int, length_b: int) -> None:
        """Rows `a` and `b` trade their positions (their block tables)."""
        self.tables[a], self.tables[b] = self.tables[b], self.tables[a]

    def positions(self, row: int, length: int) -> list[npt.NDArray[Any]]:
        """Row `row`'s first `length` positions in each cache (per layer: key, then value),
        each [heads, length, head_size]: decoder.py's KvSlots hold a row so."""
        blocks = self.tables[row][: -(-length // BLOCK_TOKENS)]
        held = []
        for cache in self._caches:
            run = cache[blocks].transpose(1, 0, 2, 3)  # heads, blocks, BLOCK_TOKENS, size
            held.append(run.reshape(run.shape[0], -1, run.shape[3])[:, :length])
        return held


class PagedDecoder:
    """OpenVINO's compiled paged model and its KV blocks; `prefill` and `decode` as
    decoder.Decoder's. Used by one thread (the step loop's)."""

    min_exact_rows = 1  # f32: a row alone rounds as in any batch (tested), so no shadow

    def __init__(
        self,
        gguf: Path,
        config: dict[str, Any],
        threads: int,
        slots: int,
        slot_tokens: int,
    ) -> None:
        import openvino as ov  # the `openvino` extra: imported only for this path

        self.layout = DecoderLayout.of(config)
        self.threads = threads
        model = _paged_model(gguf)
        properties = {
            "INFERENCE_NUM_THREADS": threads,
            "NUM_STREAMS": 1,
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": "f32",
            # u8 (the default) requantizes a block as positions are written, so a row's
            # logits would depend on what its blocks held before; f32 is exact (as
            # decoder.py's cache), 10% slower a step at 32 rows.
            "KV_CACHE_PRECISION": "f32",
        }
        try:
            self._compiled = ov.Core().compile_model(model, "CPU", properties)
        except RuntimeError as exc:
            raise ConfigurationError(f"{gguf}: OpenVINO cannot compile it: {exc}") from None
        logits = self._compiled.output("logits").get_partial_shape()[-1]
        if logits.is_dynamic or logits.get_length() != self.layout.vocab_size:
            vocab = self.layout.vocab_size
            raise ConfigurationError(
                f"{gguf}: its logits are {logits} wide, the vocab_size {vocab}"
            )
        self._request = self._compiled.create_infer_request()
        row_blocks = -(-slot_tokens // BLOCK_TOKENS)
        rows = slots + 1  # a spare row after the slots: the shadow of a lone row (loop.py)
        ports = {port.get_any_name(): port for port in self._compiled.inputs}
        caches = []
        for name in (f"{kind}{i}" for i in range(self.layout.layers) for kind in _CACHES):
            shape = [
                rows * row_blocks if d.is_dynamic else d.get_length()
                for d in ports[name].get_partial_shape()
            ]
            tensor = ov.Tensor(ports[name].get_element_type(), shape)
            self._request.set_tensor(name, tensor)
            caches.append(tensor.data)  # per layer: key, then value (as DecoderLayout.past)
        self.kv = PagedKv(caches, rows, row_blocks)
        self.kv_dtype = np.dtype(caches[0].dtype)
        self._bytes_per_token = self.kv.nbytes // (rows * row_blocks * BLOCK_TOKENS)
        self._ov = ov

    def kv_bytes_per_token(self) -> int:
        return self._bytes_per_token

    def add_adapter(self, key: str, file: Path) -> None:
        raise ConfigurationError(
            "options.kernels is 'openvino': LoRA adapters run on ONNX Runtime's kernels "
            "(kernels: onnxruntime or both)"
        )

    def probe(self, adapter: str) -> None:  # no adapter is ever added
        raise AssertionError(adapter)

    def remove_adapter(self, key: str) -> None:
        pass

    def prefill(self, row: int, tokens: list[int], past: int, adapter: str = "") -> Logits:
        """Read `tokens` into row `row` after its first `past` positions; the logits of the
        last one."""
        ids = np.asarray(tokens, np.int64)
        positions = np.arange(past, past + len(ids), dtype=np.int64)
        begins = np.array([0, len(ids)], np.int32)
        logits: Logits = self._run(range(row, row + 1), ids, positions, begins)[-1]
        return logits

    def decode(
        self,
        tokens: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
        adapter: str = "",
        first: int = 0,
    ) -> Logits:
        """One token for each of rows first..first+n-1, each after its own `lengths`
        positions; their logits [n, vocab] (valid until the next run)."""
        count = len(tokens)
        begins = np.arange(count + 1, dtype=np.int32)
        return self._run(range(first, first + count), tokens, lengths, begins)

    def _run(
        self,
        rows: range,
        ids: npt.NDArray[np.int64],
        positions: npt.NDArray[np.int64],
        begins: npt.NDArray[np.int32],
    ) -> Logits:
        """Rows `rows` read `ids` (row i's at ids[begins[i]:begins[i + 1]]) at `positions`,
        in one infer; the logits of each row's last token [rows, vocab] (for a decode step,
        a view valid until the next run)."""
        tables = self.kv.tables
        feeds = {
            "input_ids": ids,
            "position_ids": positions,
            "past_lens": positions[begins[:-1]].astype(np.int32),
            "subsequence_begins": begins,
            "block_indices": np.concatenate([tables[r] for r in rows]),
            "block_indices_begins": np.arange(len(rows) + 1, dtype=np.int32) * self.kv.row_blocks,
            "max_context_len": np.array(positions.max() + 1, np.int32),
        }
        for name, value in feeds.items():
            self._request.set_tensor(name, self._ov.Tensor(value))
        self._request.infer()
        # The head runs on every token read: a Gather of each row's last one before it
        # (head.py's slice) made a prefill 0.8x but every decode step 1.04-1.18x.
        logits: Logits = self._request.get_tensor("logits").data.reshape(-1, self.layout.vocab_size)
        return logits if len(logits) == len(rows) else logits[begins[1:] - 1]


def imported_gguf(folder: Path) -> Path:
    """The GGUF `inferwire models import` made `folder` from (its inferwire-import.json),
    if that file is still there with the same bytes."""
    record_file = folder / "inferwire-import.json"
    try:
        record = json.loads(record_file.read_text())
    except (OSError, ValueError):
        record = {}
    source = Path(str(record.get("source", "")))
    if record.get("source_kind") != "gguf" or not source.is_file():
        raise ConfigurationError(
            f"options.gguf is unset and {record_file} names no GGUF that is on this machine: "
            "options.kernels 'openvino' and 'both' run the GGUF a folder was imported from; "
            "set options.gguf"
        )
    digest = hashlib.sha256()
    with source.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != record.get("source_sha256"):
        raise ConfigurationError(
            f"options.gguf is unset and {source}, which {record_file} names, is not the file "
            "the folder was imported from (its sha256 differs); set options.gguf"
        )
    return source


def _paged_model(gguf: Path) -> Any:
    """The GGUF as OpenVINO GenAI builds it, with paged attention."""
    import openvino as ov
    import openvino_genai as ov_genai
    from openvino._offline_transformations import paged_attention_transformation

    with tempfile.TemporaryDirectory() as folder:
        linked = Path(folder) / gguf.name
        linked.symlink_to(gguf.resolve())
        try:  # the pipeline saves the IR it builds beside the GGUF it reads
            ov_genai.LLMPipeline(str(linked), "CPU", enable_save_ov_model=True)
            model = ov.Core().read_model(str(Path(folder) / "openvino_model.xml"))
        except RuntimeError as exc:
            raise ConfigurationError(f"{gguf}: OpenVINO GenAI cannot read it: {exc}") from None
    paged_attention_transformation(model)
    return model
