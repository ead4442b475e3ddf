"""An encoder folder (`inferwire models import` of a sentence-transformers model) loaded:
its ONNX graph in an ONNX Runtime session, its tokenizer.json by Hugging Face's tokenizers,
and `encoder_config.json` (its window, width, pooling and whether it normalizes).

The graph (importer/encoder_graph.py) takes padded `input_ids` and `attention_mask` and
gives each row's mean-pooled embedding; `encode` runs one padded batch. An input becomes
token ids here (`prepare`): a text through the tokenizer with the model's special tokens
([CLS] ... [SEP]), token ids as they are given (what Tokenize returns for a text, specials
included); longer than the window, it is refused naming its field and its count, or cut
to the window keeping its final special token (as sentence-transformers truncates).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from inferwire.core.embeddings import EmbeddingInput
from inferwire.core.errors import FieldViolation, InvalidArgumentError, ModelNotReadyError

CONFIG = "encoder_config.json"  # written by importer/sentence_transformers.py
GRAPH = "model.onnx"


@dataclass(frozen=True)
class EncoderConfig:
    """`encoder_config.json`: what the import found in the sentence-transformers folder."""

    hidden_size: int  # the embeddings' length
    max_seq_length: int  # the window: tokens of one input, special tokens included
    vocab_size: int
    normalize: bool  # the model's pipeline ends in Normalize: its default
    pad_token_id: int
    sep_token_id: int | None  # the final special token a cut input keeps
    pooling: str = "mean"

    @classmethod
    def read(cls, folder: Path) -> EncoderConfig:
        data = json.loads((folder / CONFIG).read_text())
        fields = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**fields)


def cpus() -> int:
    """The CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class EncoderModel:
    """One loaded encoder; `encode` is called from one thread at a time (its step loop)."""

    def __init__(self, folder: Path, threads: int | None = None) -> None:
        for name in (CONFIG, GRAPH, "tokenizer.json"):
            if not (folder / name).is_file():
                raise ModelNotReadyError(
                    f"{folder} has no {name}: not an encoder folder (make one with "
                    "`inferwire models import SENTENCE_TRANSFORMERS_DIR --name NAME`)"
                )
        self.config = EncoderConfig.read(folder)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or cpus()
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(
            str(folder / GRAPH), options, providers=["CPUExecutionProvider"]
        )

    @property
    def window(self) -> int:
        return self.config.max_seq_length

    def tokenize(self, text: str) -> list[int]:
        """The ids the model sees for `text`, its special tokens included."""
        return list(self.tokenizer.encode(text).ids)

    def prepare(
        self, inputs: tuple[EmbeddingInput, ...], fields: tuple[str, ...], truncate: bool
    ) -> list[list[int]]:
        """Each input's token ids within the window; raise InvalidArgumentError naming every
        input that is too long (without `truncate`) or holds an id outside the vocabulary."""
        texts = [i for i in inputs if isinstance(i, str)]
        encoded = iter(e.ids for e in self.tokenizer.encode_batch(texts)) if texts else iter(())
        prepared: list[list[int]] = []
        violations: list[FieldViolation] = []
        vocab, window = self.config.vocab_size, self.window
        for field, given in zip(fields, inputs, strict=True):
            ids = list(next(encoded)) if isinstance(given, str) else list(given)
            if not isinstance(given, str) and (bad := [t for t in ids if t >= vocab]):
                violations.append(
                    FieldViolation(
                        field,
                        f"token id {bad[0]} is outside the model's vocabulary (0 to {vocab - 1})",
                    )
                )
            elif len(ids) > window and not truncate:
                violations.append(
                    FieldViolation(
                        field,
                        f"is {len(ids)} tokens; the model's window is {window} "
                        "(set truncate to cut it)",
                    )
                )
            elif len(ids) > window:
                ids = self._cut(ids, isinstance(given, str))
            prepared.append(ids)
        if violations:
            raise InvalidArgumentError(violations[:16])
        return prepared

    def _cut(self, ids: list[int], keep_last: bool) -> list[int]:
        sep = self.config.sep_token_id
        if keep_last and sep is not None and ids[-1] == sep:
            return [*ids[: self.window - 1], sep]
        return ids[: self.window]

    def encode(self, batch: list[list[int]]) -> np.ndarray:
        """The pooled (not normalized) embeddings of one batch, padded to its longest."""
        longest = max(len(ids) for ids in batch)
        input_ids = np.full((len(batch), longest), self.config.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(batch), longest), dtype=np.int64)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1
        feeds: dict[str, Any] = {"input_ids": input_ids, "attention_mask": mask}
        (pooled,) = self.session.run(["sentence_embedding"], feeds)
        return np.asarray(pooled, dtype=np.float32)

    def largest_batch(self, max_inputs: int, max_tokens: int) -> tuple[int, int]:
        """(rows, tokens each) of the batch that takes the most memory within the step
        loop's bounds: inputs as long as the window (attention grows with its square), as
        many as fit (one at least: the oldest input always runs)."""
        return max(1, min(max_inputs, max_tokens // self.window)), self.window

    def warm_up(self, max_inputs: int, max_tokens: int) -> None:
        """Run the largest batch once, so that ONNX Runtime's arena holds what serving
        will (and the load's memory is what serving takes)."""
        rows, length = self.largest_batch(max_inputs, max_tokens)
        self.encode([[self.config.pad_token_id + 1] * length] * rows)
