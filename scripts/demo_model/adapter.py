"""The Sonnets LoRA adapter of the bundled model, and the adapter-ready base it runs on.

Stages (scripts/build_demo_adapter.py runs them):
1. read the bundled model's weights back out of its ONNX graph (MatMulNBits, 8 bits,
   blocks of 32, no zero points: w = (q - 128) * scale) into a torch Llama forward that
   follows the graph (RMSNorm, GQA with rotary halves from cos_cache/sin_cache, SwiGLU);
   checked against ONNX Runtime's logits on held-out text;
2. train a LoRA (rank R on every projection of every layer) on the Sonnets, with the
   base frozen;
3. write the adapter-ready base the way Olive's ExtractAdapters pass does: each target
   projection gains `+ (x @ lora_A) @ lora_B`, whose weights are graph inputs with
   all-zero initializers as defaults (so the base without an adapter computes exactly
   what it did), and the adapter file (`onnxruntime.AdapterFormat`) holds trained values
   for those inputs (lora_B scaled by alpha / R).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

RANK = 8
ALPHA = 16.0
TARGETS = ("attn.qkv_proj", "attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
LAYERS = 4
HEADS, KV_HEADS, HEAD_SIZE = 8, 4, 32
EPSILON = 1e-6

# A play's speaker line as the corpus writes it (corpus.clean): `NAME:` alone on a line.
SPEAKER_LINE = re.compile(r"^[A-Z][A-Z'. ]{0,30}[A-Z.]:\s*$", re.M)


def lora_names(layer: int, target: str) -> tuple[str, str]:
    prefix = f"model.layers.{layer}.{target}"
    return f"{prefix}.lora_A.weight", f"{prefix}.lora_B.weight"


# ---- 1. the weights, and a torch forward that follows the graph ------------------------


def _dequantize(q8: np.ndarray, scales: np.ndarray, k: int) -> np.ndarray:
    """MatMulNBits (bits 8, no zero points) as the (K, N) matrix it multiplies by."""
    n, blocks, block_size = q8.shape
    w = (q8.astype(np.float32) - 128.0) * scales.astype(np.float32)[:, :, None]
    return w.reshape(n, blocks * block_size)[:, :k].T.copy()


def read_weights(model_dir: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(model_dir / "model.onnx"))
    tensors = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    weights = {}
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            assert attrs["bits"] == 8 and len(node.input) == 3, node.name
            name = node.input[1].removesuffix(".MatMul.weight_Q8")
            weights[name] = _dequantize(tensors[node.input[1]], tensors[node.input[2]], attrs["K"])
    for name, value in tensors.items():
        if name.endswith("layernorm.weight") or name in ("cos_cache", "sin_cache"):
            weights[name] = value
    weights["embed"] = tensors["model.embed_tokens.weight"]
    return weights


class LoraLlama(torch.nn.Module):
    """The bundled model's forward pass (full sequence, causal), with LoRA on TARGETS."""

    def __init__(self, weights: dict[str, np.ndarray], seed: int) -> None:
        super().__init__()
        self.w = {k: torch.from_numpy(np.array(v)) for k, v in weights.items()}
        generator = torch.Generator().manual_seed(seed)
        self.lora = torch.nn.ParameterDict()
        for layer in range(LAYERS):
            for target in TARGETS:
                k, n = self.w[f"model.layers.{layer}.{target}"].shape
                a, b = lora_names(layer, target)
                bound = 1 / math.sqrt(k)  # PEFT's default: A uniform, B zero
                init = (torch.rand(k, RANK, generator=generator) * 2 - 1) * bound
                self.lora[a.replace(".", "_")] = torch.nn.Parameter(init)
                self.lora[b.replace(".", "_")] = torch.nn.Parameter(torch.zeros(RANK, n))

    def _project(self, x: torch.Tensor, layer: int, target: str, lora: bool) -> torch.Tensor:
        y = x @ self.w[f"model.layers.{layer}.{target}"]
        if lora:
            a, b = lora_names(layer, target)
            a_, b_ = self.lora[a.replace(".", "_")], self.lora[b.replace(".", "_")]
            y = y + (x @ a_) @ b_ * (ALPHA / RANK)
        return y

    @staticmethod
    def _norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPSILON) * weight

    def _rotary(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[2]
        cos, sin = self.w["cos_cache"][:t], self.w["sin_cache"][:t]
        half = HEAD_SIZE // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def forward(self, ids: torch.Tensor, lora: bool = True) -> torch.Tensor:
        batch, t = ids.shape
        h = self.w["embed"][ids]
        mask = torch.full((t, t), float("-inf")).triu(1)
        for layer in range(LAYERS):
            pre = f"model.layers.{layer}"
            x = self._norm(h, self.w[f"{pre}.input_layernorm.weight"])
            qkv = self._project(x, layer, "attn.qkv_proj", lora)
            q, k, v = qkv.split([HEADS * HEAD_SIZE, KV_HEADS * HEAD_SIZE, KV_HEADS * HEAD_SIZE], -1)
            q = self._rotary(q.view(batch, t, HEADS, HEAD_SIZE).transpose(1, 2))
            k = self._rotary(k.view(batch, t, KV_HEADS, HEAD_SIZE).transpose(1, 2))
            v = v.view(batch, t, KV_HEADS, HEAD_SIZE).transpose(1, 2)
            k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
            v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
            scores = q @ k.transpose(-1, -2) / math.sqrt(HEAD_SIZE) + mask
            attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, t, HEADS * HEAD_SIZE)
            h = h + self._project(attn, layer, "attn.o_proj", lora)
            x = self._norm(h, self.w[f"{pre}.post_attention_layernorm.weight"])
            gate = self._project(x, layer, "mlp.gate_proj", lora)
            up = self._project(x, layer, "mlp.up_proj", lora)
            h = h + self._project(torch.nn.functional.silu(gate) * up, layer, "mlp.down_proj", lora)
        final = self._norm(h, self.w[f"model.layers.{LAYERS}.final_norm_layernorm.weight"])
        return final @ self.w["lm_head"]

    def adapter_arrays(self) -> dict[str, np.ndarray]:
        """The adapter's values for the adapter-ready graph's inputs (B scaled)."""
        arrays = {}
        for layer in range(LAYERS):
            for target in TARGETS:
                a, b = lora_names(layer, target)
                a_ = self.lora[a.replace(".", "_")].detach().numpy()
                b_ = self.lora[b.replace(".", "_")].detach().numpy() * (ALPHA / RANK)
                arrays[a], arrays[b] = a_.astype(np.float32), b_.astype(np.float32)
        return arrays


# ---- 2. training ------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainSettings:
    # About 8 passes over the 19k training tokens; 300 steps overfit (held-out perplexity
    # 90 -> 114, against 90 -> 85 at 80).
    steps: int = 80
    batch: int = 8
    window: int = 256
    lr: float = 2e-3
    seed: int = 20261201


def train(model: LoraLlama, ids: list[int], settings: TrainSettings, log) -> list[float]:
    torch.manual_seed(settings.seed)
    rng = random.Random(settings.seed)
    optimiser = torch.optim.AdamW(model.lora.parameters(), lr=settings.lr, weight_decay=0.0)
    data = torch.tensor(ids)
    losses = []
    for step in range(settings.steps):
        starts = [rng.randrange(0, len(ids) - settings.window - 1) for _ in range(settings.batch)]
        batch = torch.stack([data[s : s + settings.window + 1] for s in starts])
        lr = settings.lr * min(1.0, (step + 1) / 20) * (0.1 + 0.9 * (1 - step / settings.steps))
        for group in optimiser.param_groups:
            group["lr"] = lr
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
        )
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
        if step % 25 == 0 or step == settings.steps - 1:
            log(f"step {step}: loss {loss.item():.3f}")
    return losses


@torch.no_grad()
def mean_nll(model: LoraLlama, ids: list[int], window: int, lora: bool) -> float:
    total, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = torch.tensor(ids[start : start + window + 1])[None]
        if chunk.shape[1] < 2:
            break
        logits = model(chunk[:, :-1], lora=lora)
        loss = torch.nn.functional.cross_entropy(logits[0], chunk[0, 1:], reduction="sum")
        total, count = total + float(loss), count + chunk.shape[1] - 1
    return total / count


# ---- 3. the adapter-ready base and the adapter file ---------------------------------------


def adapter_ready(model_dir: Path, out_dir: Path) -> list[str]:
    """Write model.onnx (+ .data) of `model_dir` with a zero-default LoRA branch on every
    target projection into `out_dir`; returns the new graph inputs' names."""
    model = onnx.load(str(model_dir / "model.onnx"))
    graph = model.graph
    nodes = list(graph.node)
    added_inputs: list[str] = []
    new_nodes = []
    for node in nodes:
        new_nodes.append(node)
        if node.op_type != "MatMulNBits" or not node.name.startswith("/model/layers."):
            continue
        layer = int(node.name.split("/")[2].removeprefix("layers."))
        target = ".".join(node.name.split("/")[3:5])
        if target not in TARGETS:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        k, n = attrs["K"], attrs["N"]
        a, b = lora_names(layer, target)
        output = node.output[0]
        base_out = f"{output}/base"
        node.output[0] = base_out
        prefix = node.name.removesuffix("_Q8")
        new_nodes += [
            helper.make_node(
                "MatMul", [node.input[0], a], [f"{prefix}/lora_A/output_0"], name=f"{prefix}/lora_A"
            ),
            helper.make_node(
                "MatMul",
                [f"{prefix}/lora_A/output_0", b],
                [f"{prefix}/lora_B/output_0"],
                name=f"{prefix}/lora_B",
            ),
            helper.make_node(
                "Add", [base_out, f"{prefix}/lora_B/output_0"], [output], name=f"{prefix}/lora_Add"
            ),
        ]
        for name, shape in ((a, [k, RANK]), (b, [RANK, n])):
            graph.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
            graph.initializer.append(numpy_helper.from_array(np.zeros(shape, np.float32), name))
            added_inputs.append(name)
    del graph.node[:]
    graph.node.extend(new_nodes)
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx.save(
        model,
        str(out_dir / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx.data",
        size_threshold=1024,
    )
    return added_inputs


def write_adapter(arrays: dict[str, np.ndarray], path: Path) -> None:
    import onnxruntime as ort

    adapter = ort.AdapterFormat()
    adapter.set_adapter_version(1)
    adapter.set_model_version(1)
    adapter.set_parameters({k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in arrays.items()})
    adapter.export_adapter(str(path))
