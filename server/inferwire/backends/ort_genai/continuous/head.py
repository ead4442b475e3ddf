"""The decoder graph with its LM head on each row's last two positions only.

A prompt chunk of n tokens needs one row of logits, but the builder's export computes
the head (hidden × vocabulary: 576 × 49152 for SmolLM2) for all n positions: about a
fifth of a 60-token prefill's work. A Slice of the final norm's output along the
sequence (positions -2 onwards) before everything that reads it leaves the layers and
the KV cache as they are and gives [batch, min(n, 2), vocab] logits.

Two positions, not one: ONNX Runtime's CPU kernels round a one-row MatMul differently
from a several-row one, and prompts are read in chunks of two or more (loop.py), so the
last row's logits stay bit for bit the full graph's (tests/engine/test_continuous.py).
A decode step (one position a row) is unchanged.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

# The normalizations an export ends its layers with; the last one in the graph feeds
# the head.
_NORMS = frozenset(
    {
        "SimplifiedLayerNormalization",
        "SkipSimplifiedLayerNormalization",
        "LayerNormalization",
        "SkipLayerNormalization",
        "RMSNormalization",
    }
)
_SLICED = "inferwire/head/last_positions"


def sliced_head(file: Path, logits: str) -> bytes | None:
    """`file`'s graph with the head on the last two positions, serialized (its external
    data stays where it is); None where the graph's shape is not the expected one (then
    the graph is run as it is)."""
    model = onnx.load(str(file), load_external_data=False)
    graph = model.graph
    norms = [node for node in graph.node if node.op_type in _NORMS]
    if not norms or not norms[-1].output:
        return None
    hidden = norms[-1].output[0]
    readers = [node for node in graph.node if hidden in node.input]
    # Everything after the norm must lead to the logits only (no hidden-state output).
    if not readers or any(output.name == hidden for output in graph.output):
        return None
    if _downstream_outputs(graph, hidden) != {logits}:
        return None
    constants = {
        f"{_SLICED}/starts": -2,
        f"{_SLICED}/ends": 2**62,
        f"{_SLICED}/axes": 1,
    }
    for name, value in constants.items():
        graph.initializer.append(helper.make_tensor(name, TensorProto.INT64, [1], [value]))
    for node in readers:
        for index, name in enumerate(node.input):
            if name == hidden:
                node.input[index] = _SLICED
    position = list(graph.node).index(norms[-1]) + 1
    graph.node.insert(
        position, helper.make_node("Slice", [hidden, *constants], [_SLICED], name=_SLICED)
    )
    return bytes(model.SerializeToString())


def _downstream_outputs(graph: onnx.GraphProto, tensor: str) -> set[str]:
    """The graph outputs computed from `tensor`."""
    reached, frontier = {tensor}, [tensor]
    while frontier:
        name = frontier.pop()
        for node in graph.node:
            if name in node.input:
                for output in node.output:
                    if output and output not in reached:
                        reached.add(output)
                        frontier.append(output)
    return {output.name for output in graph.output} & reached
