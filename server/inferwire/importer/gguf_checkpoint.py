"""A GGUF file as a Hugging Face checkpoint: what ONNX Runtime GenAI's model builder reads.

The builder reads only F16/F32 GGUF files, and takes the model's configuration and
tokenizer from Hugging Face files, so a GGUF file is first written out as a checkpoint
directory (`config.json`, `generation_config.json`, `model.safetensors` in fp32,
`tokenizer.json`, `tokenizer_config.json`) with nothing but the `gguf` package and numpy:
- every tensor dequantized by `gguf.quants.dequantize` (every type the package reads),
  named as transformers names a Llama's, and the query and key projections permuted back
  (llama.cpp's converter interleaves their rotary halves for its own rope);
- the tokenizer rebuilt from the file's own vocabulary, merges and token types
  (`tokenizer.ggml.*`), with the pre-tokenizer that llama.cpp applies for the file's
  `tokenizer.ggml.pre`, so both tokenize alike; control tokens are special tokens;
- the chat template (`tokenizer.chat_template`) and special token ids carried over; the
  end of generation is every token llama.cpp ends on (its end of sequence, and
  `<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<end_of_turn>` where the file has them).

Only the `llama` architecture (Llama, SmolLM, Mistral written as llama) is converted;
anything else is refused with one line naming what the file says it is.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inferwire.importer.errors import ImportRefusedError

GGUF_MAGIC = b"GGUF"
ARCHITECTURES = ("llama",)
# Tokens whose text llama.cpp treats as an end of generation (llama-vocab.cpp).
END_OF_GENERATION_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")
_CONTROL, _USER_DEFINED = 3, 4  # gguf token types
# llama.cpp's pre-tokenizer for each `tokenizer.ggml.pre` it can be, as tokenizers' pieces.
# GPT-2's ends in `|\s+` here as in Hugging Face's ByteLevel (llama.cpp's has no such
# branch; with isolated splits the two cut alike). ONNX Runtime Extensions, which serves
# the tokenizer, knows the whole pattern; without that branch it split 36 of 78 Shakespeare
# samples apart from llama.cpp ("did'st", "SCENE III", ", with").
_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    # Split regexes applied in order, each `isolated`, before the byte-level mapping.
    "gpt-2": (_GPT2_REGEX,),
    "default": (_GPT2_REGEX,),
    "smollm": (r"\p{N}", _GPT2_REGEX),
    "starcoder": (r"\p{N}", _GPT2_REGEX),
    "llama-bpe": (_LLAMA3_REGEX,),
    "llama3": (_LLAMA3_REGEX,),
}


def is_gguf(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(4) == GGUF_MAGIC


@dataclass(frozen=True)
class GgufSummary:
    """What a GGUF file says it holds, read before anything is converted."""

    architecture: str
    name: str
    tensor_types: dict[str, int]  # type name -> how many tensors
    context_length: int


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def open_gguf(path: Path) -> Any:
    """The file's reader; ImportRefusedError when it is no GGUF file gguf can read."""
    from gguf import GGUFReader

    if not is_gguf(path):
        raise ImportRefusedError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
    try:
        return GGUFReader(str(path))
    except (ValueError, OSError) as error:
        raise ImportRefusedError(f"{path}: a GGUF file gguf cannot read: {error}") from None


def summary(reader: Any) -> GgufSummary:
    architecture = str(_field(reader, "general.architecture", ""))
    types: dict[str, int] = {}
    for tensor in reader.tensors:
        types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
    return GgufSummary(
        architecture=architecture,
        name=str(_field(reader, "general.name", "")),
        tensor_types=types,
        context_length=int(_field(reader, f"{architecture}.context_length", 0) or 0),
    )


def check_convertible(path: Path, reader: Any) -> GgufSummary:
    """Refuse, in one line, a file the importer or the builder cannot take."""
    found = summary(reader)
    if found.architecture not in ARCHITECTURES:
        raise ImportRefusedError(
            f"{path}: architecture {found.architecture!r} is not one the importer converts "
            f"from GGUF ({', '.join(ARCHITECTURES)}); import its Hugging Face checkpoint instead"
        )
    from gguf.quants import _type_traits  # the types gguf can dequantize

    readable = {"F32", "F16", "BF16", "F64"} | {t.name for t in _type_traits}
    unreadable = sorted(set(found.tensor_types) - readable)
    if unreadable:
        raise ImportRefusedError(
            f"{path}: tensor type {unreadable[0]} cannot be dequantized by gguf "
            f"{_gguf_version()}; use a GGUF file of another type (Q8_0, Q4_K_M, F16, ...)"
        )
    if str(_field(reader, "tokenizer.ggml.model", "")) != "gpt2":
        model = _field(reader, "tokenizer.ggml.model", "none")
        raise ImportRefusedError(
            f"{path}: tokenizer model {model!r} is not converted (only byte-level BPE, 'gpt2')"
        )
    pre = str(_field(reader, "tokenizer.ggml.pre", "default"))
    if pre not in PRE_TOKENIZERS:
        raise ImportRefusedError(
            f"{path}: pre-tokenizer {pre!r} is not one the importer knows "
            f"({', '.join(sorted(PRE_TOKENIZERS))}); import its Hugging Face checkpoint instead"
        )
    return found


def _gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


# ---- the configuration ----------------------------------------------------------------


def hf_config(reader: Any) -> dict[str, Any]:
    arch = "llama"

    def meta(key: str, default: Any = None) -> Any:
        return _field(reader, f"{arch}.{key}", default)

    heads = int(meta("attention.head_count"))
    hidden = int(meta("embedding_length"))
    names = {t.name for t in reader.tensors}
    vocab = len(_field(reader, "tokenizer.ggml.tokens"))
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(meta("feed_forward_length")),
        "num_hidden_layers": int(meta("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta("attention.head_count_kv", heads)),
        "head_dim": int(meta("rope.dimension_count", hidden // heads)),
        "max_position_embeddings": int(meta("context_length")),
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta("rope.freq_base", 10000.0)),
        "vocab_size": int(meta("vocab_size", vocab)),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": "output.weight" not in names,
        "torch_dtype": "float32",
        **_special_ids(reader),
    }
    scaling = meta("rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise ImportRefusedError(f"rope scaling {scaling!r} is not converted (only linear)")
        config["rope_scaling"] = {"type": "linear", "factor": float(meta("rope.scaling.factor"))}
    return config


def _special_ids(reader: Any) -> dict[str, Any]:
    ids: dict[str, Any] = {}
    for name in ("bos", "eos", "unknown", "padding"):
        value = _field(reader, f"tokenizer.ggml.{name}_token_id")
        if value is not None:
            key = {"unknown": "unk", "padding": "pad"}.get(name, name)
            ids[f"{key}_token_id"] = int(value)
    return ids


def end_of_generation_ids(reader: Any) -> list[int]:
    """The end of sequence first, then every token llama.cpp also ends generation on."""
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    ids = [int(_field(reader, "tokenizer.ggml.eos_token_id"))]
    ids += [tokens.index(t) for t in END_OF_GENERATION_TEXTS if t in tokens]
    return list(dict.fromkeys(ids))


# ---- the weights -------------------------------------------------------------------------

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str:
    stem, _, suffix = gguf_name.rpartition(".")
    if stem.startswith("blk."):
        _, layer, part = stem.split(".", 2)
        if part in _LAYER_NAMES:
            return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{suffix}"
    elif stem in _TOP_NAMES:
        return f"{_TOP_NAMES[stem]}.{suffix}"
    raise ImportRefusedError(f"tensor {gguf_name!r} has no place in a Llama checkpoint")


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's converter's permutation of a query or key projection."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def weights(reader: Any, config: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """Each tensor as (transformers' name, fp32 array), dequantized, in file order."""
    from gguf.quants import dequantize

    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape))  # numpy order
        array = dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape)
        name = hf_name(tensor.name)
        if name.endswith("q_proj.weight"):
            array = _unpermute(array, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            array = _unpermute(array, config["num_key_value_heads"])
        yield name, np.ascontiguousarray(array)


# ---- the tokenizer --------------------------------------------------------------------


def tokenizer_json(reader: Any) -> str:
    """tokenizers' tokenizer.json for the file's byte-level BPE vocabulary."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    tokens = [str(t) for t in _field(reader, "tokenizer.ggml.tokens")]
    types = [int(t) for t in _field(reader, "tokenizer.ggml.token_type")]
    merges = [_merge(str(m)) for m in _field(reader, "tokenizer.ggml.merges")]
    vocab = {token: index for index, token in enumerate(tokens)}
    unknown = _field(reader, "tokenizer.ggml.unknown_token_id")
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            unk_token=tokens[int(unknown)] if unknown is not None else None,
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    pre = str(_field(reader, "tokenizer.ggml.pre", "default"))
    splits = [
        pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in PRE_TOKENIZERS[pre]
    ]
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    added = [
        AddedToken(tokens[i], special=types[i] == _CONTROL, normalized=False)
        for i in range(len(tokens))
        if types[i] in (_CONTROL, _USER_DEFINED)
    ]
    tokenizer.add_tokens(added)
    return str(tokenizer.to_str())


def _merge(line: str) -> tuple[str, str]:
    left, _, right = line.partition(" ")
    return left, right


def tokenizer_config(reader: Any, ids: dict[str, Any]) -> dict[str, Any]:
    tokens = _field(reader, "tokenizer.ggml.tokens")

    def text(key: str) -> str | None:
        return str(tokens[ids[key]]) if key in ids else None

    config: dict[str, Any] = {
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(_field(reader, "llama.context_length", 0) or 0),
        "bos_token": text("bos_token_id"),
        "eos_token": text("eos_token_id"),
        "unk_token": text("unk_token_id"),
        "pad_token": text("pad_token_id"),
    }
    template = _field(reader, "tokenizer.chat_template")
    if template:
        config["chat_template"] = str(template)
    return config


# ---- the checkpoint -------------------------------------------------------------------


def write_checkpoint(
    reader: Any, directory: Path, progress: Callable[[int, int], None] = lambda done, all_: None
) -> dict[str, Any]:
    """Write the Hugging Face checkpoint of `reader`'s file into `directory`; its config."""
    from safetensors.numpy import save_file

    config = hf_config(reader)
    tensors: dict[str, np.ndarray] = {}
    count = len(reader.tensors)
    for done, (name, array) in enumerate(weights(reader, config), start=1):
        tensors[name] = array
        progress(done, count)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    generation = {key: config[key] for key in ("bos_token_id", "pad_token_id") if key in config} | {
        "eos_token_id": end_of_generation_ids(reader)
    }
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2))
    (directory / "tokenizer.json").write_text(tokenizer_json(reader))
    special = {k: v for k, v in config.items() if k.endswith("_token_id")}
    (directory / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(reader, special), indent=2)
    )
    return config
