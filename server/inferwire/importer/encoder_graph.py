"""A BERT encoder's forward pass with mean pooling, written as an ONNX graph from the
checkpoint's safetensors (numpy and onnx only: no torch, no tracing).

The graph takes `input_ids` and `attention_mask` (int64, [batch, sequence]) and gives
`sentence_embedding` (float32, [batch, hidden]): each sequence's last hidden states averaged
over its unmasked tokens, as sentence-transformers' `Pooling(mean)` does; normalizing is
left to the server (a request may ask for raw vectors). It is HF `BertModel`'s
computation, op for op, in fp32: the word, position and (type 0) token-type embeddings and
their LayerNorm; per layer, self-attention (Q, K and V as one MatMul, the 1/sqrt(d) scale
folded into Q's weights, a padding mask added before the softmax), its output projection
and LayerNorm, the feed-forward block with the exact (erf) GELU, and its LayerNorm.
ONNX Runtime fuses what it recognises when it loads the graph (LayerNorm, GELU, MatMul
with its bias).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  # LayerNormalization
MASKED = -10000.0  # added to a padded position's attention scores (HF BERT's value)


class BertConfig:
    """What the graph needs of `config.json`."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.act = str(config.get("hidden_act", "gelu"))
        self.positions = int(config.get("max_position_embeddings", 512))
        self.vocab = int(config["vocab_size"])


class _Graph:
    """Nodes and initializers, named as they are added."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []
        self._count = 0

    def weight(self, name: str, value: np.ndarray) -> str:
        self.weights.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, kind: str, *inputs: str, **attributes: Any) -> str:
        self._count += 1
        out = f"{kind.lower()}_{self._count}"
        self.nodes.append(helper.make_node(kind, list(inputs), [out], **attributes))
        return out


def build_graph(weights: dict[str, np.ndarray], config: BertConfig) -> onnx.ModelProto:
    """The encoder of `weights` (a `BertModel` checkpoint's tensors, with or without the
    `bert.` prefix) as an ONNX model."""
    w = {k.removeprefix("bert."): v.astype(np.float32) for k, v in weights.items()}
    if config.act not in ("gelu", "gelu_new", "gelu_python"):
        raise ValueError(f"hidden_act {config.act!r}: only gelu is built")
    hidden, heads = config.hidden, config.heads
    head = hidden // heads
    g = _Graph()
    g.weight("zero", np.array([0], dtype=np.int64))
    g.weight("one", np.array([1], dtype=np.int64))
    g.weight("axis_seq", np.array([1], dtype=np.int64))

    # Embeddings: a token's word vector, its position's (plus token type 0's: one table).
    words = g.op(
        "Gather", g.weight("word_embeddings", w["embeddings.word_embeddings.weight"]), "input_ids"
    )
    positions_table = (
        w["embeddings.position_embeddings.weight"] + w["embeddings.token_type_embeddings.weight"][0]
    )
    length = g.op(
        "Slice", g.op("Shape", "input_ids"), "one", g.weight("two", np.array([2], np.int64))
    )
    positions = g.op(
        "Slice", g.weight("position_embeddings", positions_table), "zero", length, "zero"
    )
    x = _layer_norm(g, g.op("Add", words, positions), w, "embeddings.LayerNorm", config.eps)

    # The padding mask, added to every head's scores: [batch, 1, 1, sequence].
    mask = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    masked = g.op(
        "Mul",
        g.op("Sub", g.weight("one_f", np.array(1.0, np.float32)), mask),
        g.weight("masked", np.array(MASKED, np.float32)),
    )
    score_bias = g.op("Unsqueeze", masked, g.weight("axes_12", np.array([1, 2], np.int64)))
    split_heads = g.weight("split_heads", np.array([0, 0, heads, head], np.int64))
    merge_heads = g.weight("merge_heads", np.array([0, 0, hidden], np.int64))
    scale = 1.0 / math.sqrt(head)
    for i in range(config.layers):
        p = f"encoder.layer.{i}."
        qkv_weight = np.concatenate(
            [
                w[p + "attention.self.query.weight"].T * scale,
                w[p + "attention.self.key.weight"].T,
                w[p + "attention.self.value.weight"].T,
            ],
            axis=1,
        )
        qkv_bias = np.concatenate(
            [
                w[p + "attention.self.query.bias"] * scale,
                w[p + "attention.self.key.bias"],
                w[p + "attention.self.value.bias"],
            ]
        )
        qkv = _linear(g, x, qkv_weight, qkv_bias, f"l{i}.qkv")
        q, k, v = (f"l{i}.{n}" for n in "qkv")
        g.nodes.append(helper.make_node("Split", [qkv], [q, k, v], axis=2))
        q = g.op("Transpose", g.op("Reshape", q, split_heads), perm=[0, 2, 1, 3])
        k = g.op("Transpose", g.op("Reshape", k, split_heads), perm=[0, 2, 3, 1])
        v = g.op("Transpose", g.op("Reshape", v, split_heads), perm=[0, 2, 1, 3])
        probs = g.op("Softmax", g.op("Add", g.op("MatMul", q, k), score_bias), axis=-1)
        context = g.op("Transpose", g.op("MatMul", probs, v), perm=[0, 2, 1, 3])
        context = g.op("Reshape", context, merge_heads)
        attended = _linear(
            g,
            context,
            w[p + "attention.output.dense.weight"].T,
            w[p + "attention.output.dense.bias"],
            f"l{i}.attention_out",
        )
        x = _layer_norm(
            g, g.op("Add", attended, x), w, p + "attention.output.LayerNorm", config.eps
        )
        inner = _linear(
            g,
            x,
            w[p + "intermediate.dense.weight"].T,
            w[p + "intermediate.dense.bias"],
            f"l{i}.intermediate",
        )
        inner = _gelu(g, inner)
        out = _linear(
            g, inner, w[p + "output.dense.weight"].T, w[p + "output.dense.bias"], f"l{i}.output"
        )
        x = _layer_norm(g, g.op("Add", out, x), w, p + "output.LayerNorm", config.eps)

    # Mean pooling over the unmasked tokens (sentence-transformers' clamp included).
    weights3 = g.op("Unsqueeze", mask, g.weight("axes_2", np.array([2], np.int64)))
    summed = g.op("ReduceSum", g.op("Mul", x, weights3), "axis_seq", keepdims=0)
    counted = g.op("ReduceSum", weights3, "axis_seq", keepdims=0)
    counted = g.op("Max", counted, g.weight("min_count", np.array(1e-9, np.float32)))
    g.nodes.append(helper.make_node("Div", [summed, counted], ["sentence_embedding"]))

    graph = helper.make_graph(
        g.nodes,
        "encoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info(
                "attention_mask", TensorProto.INT64, ["batch", "sequence"]
            ),
        ],
        [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", hidden])],
        g.weights,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="inferwire"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_graph(weights: dict[str, np.ndarray], config: BertConfig, path: Path) -> None:
    onnx.save_model(build_graph(weights, config), str(path))


def _linear(g: _Graph, x: str, weight: np.ndarray, bias: np.ndarray, name: str) -> str:
    """`x @ weight + bias` (weight as [in, out])."""
    return g.op(
        "Add", g.op("MatMul", x, g.weight(name + ".weight", weight)), g.weight(name + ".bias", bias)
    )


def _layer_norm(g: _Graph, x: str, w: dict[str, np.ndarray], prefix: str, eps: float) -> str:
    gamma = g.weight(prefix + ".weight", w[prefix + ".weight"])
    beta = g.weight(prefix + ".bias", w[prefix + ".bias"])
    return g.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=eps)


def _gelu(g: _Graph, x: str) -> str:
    """The exact GELU: x * (1 + erf(x / sqrt(2))) / 2."""
    if "gelu_half" not in {t.name for t in g.weights}:
        g.weight("gelu_half", np.array(0.5, np.float32))
        g.weight("gelu_one", np.array(1.0, np.float32))
        g.weight("gelu_root2", np.array(math.sqrt(2.0), np.float32))
    erf = g.op("Erf", g.op("Div", x, "gelu_root2"))
    return g.op("Mul", g.op("Mul", x, g.op("Add", erf, "gelu_one")), "gelu_half")
