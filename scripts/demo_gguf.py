"""The bundled `demo` model as a GGUF for llama.cpp, made with llama.cpp's own converter.

`python -m bench peers` compares inferwire with `llama-server` on the same weights; this
script made the committed `bench/models/demo-q8_0.gguf` (its sha256 beside it), so the
benchmark needs neither torch nor a retraining. Conversion is an optional step:

    .venv/bin/python -m bench.peers_setup   # llama.cpp's source (sdist), and builds the server
    python3 -m venv /tmp/convenv
    /tmp/convenv/bin/pip install torch==2.11.0 transformers==4.57.6 "numpy~=2.2.6" \
        sentencepiece "protobuf<5" onnx safetensors
    /tmp/convenv/bin/python scripts/demo_gguf.py   # --outtype f32: the unquantized twin

The same inputs give the same bytes (the committed file's sha256 was remade so).

1. The Hugging Face checkpoint is read back out of the bundled ONNX model (only `onnx` and
   `numpy`): the builder kept the token embedding and the norms in fp32 and stored every
   projection, and the output head, as int8 weight-only `MatMulNBits` (blocks of 32 along
   the input, one fp32 scale a block, zero point 128). Those are dequantized, the fused
   QKV split into q, k and v, and written as `model.safetensors` with a `config.json`
   (LlamaForCausalLM, untied head: the head is the dequantized int8 one ORT runs) and the
   bundled tokenizer files. The bundled model's built-in LoRA slots are zero (the base),
   and are checked to be.
2. llama.cpp's `convert_hf_to_gguf.py`, from the llama-cpp-python sdist's vendored tree,
   with `--outtype q8_0`: blocks of 32 with an fp16 scale, the closest GGUF type to
   ORT's int8 weight-only blocks of 32 (the converter re-quantizes the dequantized
   weights, so a block's scale is its largest magnitude / 127 where ORT's was / 128).
3. The converter refuses a BPE pre-tokenizer whose hash it does not know. The demo's
   tokenizer is `tokenizers`' ByteLevel pre-tokenizer with the GPT-2 split regex, which is
   llama.cpp's `gpt-2` pre-tokenizer; the converter is run with that mapping for exactly
   this tokenizer's hash (DEMO_CHKHSH) and no other. `python -m bench peers` proves the
   mapping on every run: the bundled tokenizer (ONNX Runtime GenAI's, as inferwire uses
   it) and llama-server's tokenize a sample of the corpus to the same ids, and a greedy
   prompt gives the same first tokens from both servers (bench/peers_checks.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.peers_setup import GGUF, SOURCE, sha256_of  # noqa: E402  (standard library only)

BUNDLED = REPO / "server/inferwire/models/demo"
LLAMA_CPP = SOURCE  # llama.cpp's tree in the sdist bench/peers_setup.py unpacks
# sha256 of str(tokenizer.encode(the converter's check text)) for the demo's tokenizer.
DEMO_CHKHSH = "bae490e27e9aeaf4f67e72de19ba34d25e88cedb0f987048087b2de4191fa53c"
PRE_TOKENIZER = "gpt-2"
ZERO_POINT = 128  # MatMulNBits' default for 8 bits without zero points


# ---- 1. the Hugging Face checkpoint out of the ONNX model ------------------------------


def _dequantize(weights: dict[str, Any], prefix: str, in_features: int) -> Any:
    """A MatMulNBits int8 weight as a float32 [out, in] matrix (HF Linear layout)."""
    import numpy as np

    quantized = weights[f"{prefix}.MatMul.weight_Q8"].astype(np.float32)  # [N, K/32, 32]
    scales = weights[f"{prefix}.MatMul.weight_scales"].astype(np.float32)  # [N, K/32]
    matrix = ((quantized - ZERO_POINT) * scales[..., None]).reshape(quantized.shape[0], -1)
    return np.ascontiguousarray(matrix[:, :in_features])  # drop the padding of the last block


def hf_checkpoint(model_dir: Path, out: Path) -> dict[str, Any]:
    """Write config.json, model.safetensors and the tokenizer files; the config."""
    import numpy as np
    import onnx
    from onnx import numpy_helper
    from safetensors.numpy import save_file

    genai = json.loads((model_dir / "genai_config.json").read_text())["model"]
    decoder = genai["decoder"]
    graph = onnx.load(str(model_dir / decoder["filename"]), load_external_data=True).graph
    weights = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    lora = [name for name in weights if ".lora_" in name]
    if any(float(np.abs(weights[name]).max()) != 0.0 for name in lora):
        raise SystemExit("the bundled model's LoRA slots are not zero: not the base model")
    attributes = {
        node.op_type: {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        for node in graph.node
    }
    epsilon = float(f"{attributes['SimplifiedLayerNormalization']['epsilon']:.6g}")  # fp32 1e-6
    hidden, heads = decoder["hidden_size"], decoder["num_attention_heads"]
    kv_heads, head_size = decoder["num_key_value_heads"], decoder["head_size"]
    intermediate = weights["model.layers.0.mlp.gate_proj.MatMul.weight_scales"].shape[0]
    # The rotary base from the builder's cos cache: position 1, frequency 1 is base^(-2/d).
    cos = weights["cos_cache"].astype(np.float64)
    rope_theta = round(float(np.arccos(cos[1, 1]) ** (-head_size / 2)))

    tensors = {
        "model.embed_tokens.weight": weights["model.embed_tokens.weight"],
        "model.norm.weight": weights[
            f"model.layers.{decoder['num_hidden_layers']}.final_norm_layernorm.weight"
        ],
        "lm_head.weight": _dequantize(weights, "lm_head", hidden),
    }
    q_rows, kv_rows = heads * head_size, kv_heads * head_size
    for layer in range(decoder["num_hidden_layers"]):
        source, target = f"model.layers.{layer}", f"model.layers.{layer}"
        qkv = _dequantize(weights, f"{source}.attn.qkv_proj", hidden)
        tensors |= {
            f"{target}.input_layernorm.weight": weights[f"{source}.input_layernorm.weight"],
            f"{target}.post_attention_layernorm.weight": weights[
                f"{source}.post_attention_layernorm.weight"
            ],
            f"{target}.self_attn.q_proj.weight": qkv[:q_rows],
            f"{target}.self_attn.k_proj.weight": qkv[q_rows : q_rows + kv_rows],
            f"{target}.self_attn.v_proj.weight": qkv[q_rows + kv_rows :],
            f"{target}.self_attn.o_proj.weight": _dequantize(
                weights, f"{source}.attn.o_proj", q_rows
            ),
            f"{target}.mlp.gate_proj.weight": _dequantize(
                weights, f"{source}.mlp.gate_proj", hidden
            ),
            f"{target}.mlp.up_proj.weight": _dequantize(weights, f"{source}.mlp.up_proj", hidden),
            f"{target}.mlp.down_proj.weight": _dequantize(
                weights, f"{source}.mlp.down_proj", intermediate
            ),
        }
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": genai["vocab_size"],
        "hidden_size": hidden,
        "intermediate_size": int(intermediate),
        "num_hidden_layers": decoder["num_hidden_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_size,
        "max_position_embeddings": genai["context_length"],
        "rms_norm_eps": epsilon,
        "rope_theta": float(rope_theta),
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": genai["bos_token_id"],
        "eos_token_id": genai["eos_token_id"],
        "pad_token_id": genai["pad_token_id"],
        "torch_dtype": "float32",
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(
        {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
        str(out / "model.safetensors"),
    )
    shutil.copy2(model_dir / "tokenizer.json", out / "tokenizer.json")
    tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    tokenizer_config["add_bos_token"] = False  # as ONNX Runtime GenAI encodes: no BOS
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    return config


# ---- 2 and 3. llama.cpp's converter, with the pre-tokenizer mapped --------------------


def _convert_in_process(llama_cpp: Path, hf_dir: Path, out: Path, outtype: str) -> None:
    """Import convert_hf_to_gguf from llama.cpp's tree and run its main()."""
    sys.path[:0] = [str(llama_cpp / "gguf-py"), str(llama_cpp)]
    from hashlib import sha256

    import convert_hf_to_gguf  # type: ignore[import-not-found]
    from conversion.base import TextModel  # type: ignore[import-not-found]

    known = TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self: Any, tokenizer: Any) -> str:
        try:
            return str(known(self, tokenizer))
        except NotImplementedError:
            chktxt = _check_text(known)
            chkhsh = sha256(str(tokenizer.encode(chktxt)).encode()).hexdigest()
            if chkhsh != DEMO_CHKHSH:
                raise
            print(f"pre-tokenizer: hash {chkhsh} (the demo's ByteLevel BPE) -> {PRE_TOKENIZER}")
            return PRE_TOKENIZER

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = ["convert_hf_to_gguf.py", str(hf_dir), "--outtype", outtype, "--outfile", str(out)]
    convert_hf_to_gguf.main()


def _check_text(function: Any) -> str:
    """The converter's own check text, read from its source (it is a local there)."""
    import inspect

    for line in inspect.getsource(function).splitlines():
        stripped = line.strip()
        if stripped.startswith("chktxt = "):
            value = eval(stripped.removeprefix("chktxt = "), {})  # a string literal
            assert isinstance(value, str)
            return value
    raise RuntimeError("the converter's check text was not found")


def print_chkhsh(llama_cpp: Path, tokenizer_dir: Path) -> str:
    """The hash the converter computes for the demo's tokenizer."""
    sys.path[:0] = [str(llama_cpp / "gguf-py"), str(llama_cpp)]
    from hashlib import sha256

    from conversion.base import TextModel  # type: ignore[import-not-found]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    chktxt = _check_text(TextModel.get_vocab_base_pre)
    return sha256(str(tokenizer.encode(chktxt)).encode()).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-cpp", type=Path, default=LLAMA_CPP, help="llama.cpp's tree")
    parser.add_argument("--out", type=Path, default=GGUF)
    parser.add_argument("--model", type=Path, default=BUNDLED, help="an ORT GenAI model folder")
    parser.add_argument(
        "--outtype", default="q8_0", help="q8_0 (committed); f32 or f16 to compare against"
    )
    parser.add_argument("--print-chkhsh", action="store_true")
    parser.add_argument(
        "--convert-only", nargs=2, type=Path, metavar=("HF_DIR", "OUT"), help=argparse.SUPPRESS
    )  # the converter's own process
    args = parser.parse_args()
    if args.convert_only:
        _convert_in_process(args.llama_cpp, *args.convert_only, args.outtype)
        return 0
    if not (args.llama_cpp / "convert_hf_to_gguf.py").is_file():
        raise SystemExit(f"no llama.cpp tree at {args.llama_cpp}: run python -m bench.peers_setup")
    with tempfile.TemporaryDirectory() as scratch:
        hf_dir = Path(scratch) / "hf"
        config = hf_checkpoint(args.model, hf_dir)
        print(f"checkpoint: {json.dumps(config)}")
        if args.print_chkhsh:
            print(print_chkhsh(args.llama_cpp, hf_dir))
            return 0
        args.out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--llama-cpp",
                str(args.llama_cpp),
                "--outtype",
                args.outtype,
                "--convert-only",
                str(hf_dir),
                str(args.out),
            ],
            check=True,
        )
    digest = sha256_of(args.out)
    args.out.with_name(args.out.name + ".sha256").write_text(f"{digest}  {args.out.name}\n")
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes), sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
