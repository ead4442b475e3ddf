"""The continuous path's decoder graph with its LM head on the last two positions only
(backends/ort_genai/continuous/head.py), on the bundled model: every logit a prefill (in
chunks or at once) and a decode step (one row or several, base or adapter) return is the
full graph's, bit for bit; and a graph whose final norm is read by anything but the
logits is run as it is."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import inferwire
from inferwire.backends.ort_genai.continuous.decoder import Decoder
from inferwire.backends.ort_genai.continuous.head import sliced_head
from tests.support.engine import demo_model_variant

DEMO = Path(inferwire.__file__).parent / "models" / "demo"
ADAPTER = DEMO / "sonnets.onnx_adapter"


def _decoder(sliced: bool) -> Decoder:
    config = json.loads((DEMO / "genai_config.json").read_text())
    decoder = Decoder(
        DEMO, config, threads=1, slots=4, slot_tokens=256, head_on_last_positions=sliced
    )
    decoder.add_adapter("sonnets", ADAPTER)
    return decoder


def _runs(decoder: Decoder, adapter: str) -> list[np.ndarray]:
    prompt = [int(t) for t in np.random.default_rng(7).integers(10, 2000, 41)]
    logits = [
        decoder.prefill(0, prompt[:17], 0, adapter).copy(),
        decoder.prefill(0, prompt[17:], 17, adapter).copy(),
        decoder.prefill(1, prompt, 0, adapter).copy(),
        decoder.prefill(2, prompt[:2], 0, adapter).copy(),
    ]
    tokens = np.array([5, 9, 11], np.int64)
    lengths = np.array([41, 41, 2], np.int64)
    logits.append(decoder.decode(tokens, lengths, adapter).copy())
    logits.append(decoder.decode(tokens[:1], lengths[:1] + 1, adapter).copy())
    return logits


@pytest.mark.parametrize("adapter", ["", "sonnets"])
def test_sliced_head_gives_the_full_graphs_logits_bit_for_bit(adapter: str) -> None:
    assert sliced_head(DEMO / "model.onnx", "logits") is not None
    full = _runs(_decoder(False), adapter)
    sliced = _runs(_decoder(True), adapter)
    assert [a.shape for a in sliced] == [a.shape for a in full]
    for index, (ours, theirs) in enumerate(zip(sliced, full, strict=True)):
        assert np.array_equal(ours, theirs), f"run {index} differs"
    # A chunked prompt's last logits are the whole prompt's (the path's exactness rule).
    assert np.array_equal(sliced[1], sliced[2])


def _graph(hidden_is_output: bool) -> onnx.ModelProto:
    """norm -> MatMul -> logits, the norm's output also an output where asked."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", 4])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "s", 3])
    outputs = [logits]
    if hidden_is_output:
        outputs.append(helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, "s", 4]))
    nodes = [
        helper.make_node(
            "SimplifiedLayerNormalization", ["x", "scale"], ["hidden"], domain="", axis=-1
        ),
        helper.make_node("MatMul", ["hidden", "head"], ["logits"]),
    ]
    initializers = [
        helper.make_tensor("scale", TensorProto.FLOAT, [4], [1.0] * 4),
        helper.make_tensor("head", TensorProto.FLOAT, [4, 3], [0.5] * 12),
    ]
    graph = helper.make_graph(nodes, "head", [x], outputs, initializers)
    return helper.make_model(graph)


def test_a_graph_whose_hidden_state_is_read_elsewhere_is_left_as_it_is(tmp_path: Path) -> None:
    for hidden_is_output, expect_sliced in ((False, True), (True, False)):
        file = tmp_path / f"model-{hidden_is_output}.onnx"
        onnx.save(_graph(hidden_is_output), str(file))
        result = sliced_head(file, "logits")
        assert (result is not None) is expect_sliced
        if result is not None:
            nodes = onnx.load_from_string(result).graph.node
            assert [node.op_type for node in nodes] == [
                "SimplifiedLayerNormalization",
                "Slice",
                "MatMul",
            ]
            assert nodes[2].input[0] == nodes[1].output[0]


def test_a_folder_of_links_to_the_model_loads_with_the_sliced_head(tmp_path: Path) -> None:
    """ONNX Runtime refuses external data that resolves outside the folder it is given: a
    graph loaded from memory is given the model file's own folder, links resolved."""
    folder = demo_model_variant(tmp_path, "genai_config.json", lambda config: None)
    config = json.loads((folder / "genai_config.json").read_text())
    decoder = Decoder(folder, config, threads=1, slots=1, slot_tokens=64)
    assert decoder.prefill(0, [5, 9, 11], 0).shape == (decoder.layout.vocab_size,)
