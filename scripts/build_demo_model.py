"""Build the bundled `demo` model: a tiny random-weight Llama in ONNX Runtime GenAI format.

Reproducible: fixed seeds, a corpus embedded below, pinned model shape. Needs the
development-only packages torch, transformers, tokenizers and onnxruntime-genai
(its model builder); the server itself never imports any of them but the last.

    python scripts/build_demo_model.py [--output server/inferwire/models/demo]

The weights are random, so the model generates noise; it exists to exercise the
real engine end to end (tokenizer, KV cache, sampling, streaming) at a size that
can be committed. A separate script trains a real demo model.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SEED = 20261129
VOCAB_SIZE = 512
CONTEXT_LENGTH = 2048
EOS_TOKEN = "<|endoftext|>"

# Any fixed text works for a random-weight model: it only shapes the BPE merges.
CORPUS = """\
inferwire is a gRPC inference service. A protobuf contract defines how models are
loaded, run and unloaded, and how health is reported. Backends plug in behind the
server: a remote NVIDIA Triton Inference Server, and an in-process ONNX Runtime
GenAI engine that runs on the CPU or on a CUDA GPU. Hello, world! The quick brown
fox jumps over the lazy dog. To be, or not to be, that is the question. ROMEO:
But soft, what light through yonder window breaks? It is the east, and Juliet is
the sun. KING HENRY: Once more unto the breach, dear friends, once more.
0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ? ' " # $ % & @ ^ _ ` | ~
"""


def train_tokenizer(out_dir: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        model_max_length=CONTEXT_LENGTH,
    )
    fast.save_pretrained(out_dir)
    # ONNX Runtime GenAI's tokenizer picks its implementation from this class.
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "GPT2Tokenizer"
    config["add_bos_token"] = False
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def build_llama(out_dir: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT_LENGTH,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(out_dir)


def export(hf_dir: Path, output: Path, cache_dir: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "onnxruntime_genai.models.builder",
            "-i",
            str(hf_dir),
            "-o",
            str(output),
            "-p",
            "fp32",
            "-e",
            "cpu",
            "-c",
            str(cache_dir),
        ],
        check=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "server/inferwire/models/demo",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = Path(tmp, "hf")
        hf_dir.mkdir()
        train_tokenizer(hf_dir)
        build_llama(hf_dir)
        staged = Path(tmp, "onnx")
        export(hf_dir, staged, Path(tmp, "cache"))
        if args.output.exists():
            shutil.rmtree(args.output)
        args.output.mkdir(parents=True)
        for name in sorted(p.name for p in staged.iterdir()):
            shutil.copy2(staged / name, args.output / name)
    total = sum(p.stat().st_size for p in args.output.iterdir())
    print(f"wrote {args.output} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
