"""Build the random-weight baseline: a tiny random-weight Llama in ONNX Runtime GenAI format.

This used to be the bundled `demo` model. The bundled model is now trained by
scripts/train_demo_model.py, which runs this script to show that random weights fail
the word test (tests/engine/test_demo_quality.py). Reproducible: fixed seeds, a corpus
embedded below, pinned model shape. Needs the development-only packages torch,
transformers, tokenizers and onnxruntime-genai (its model builder):

    python scripts/build_demo_model.py --output /tmp/random-demo

The weights are random, so the model generates noise, at a size of 0.8 MB.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from demo_model.export import export, install
from demo_model.tokenizer import train_tokenizer

SEED = 20261129
VOCAB_SIZE = 512
CONTEXT_LENGTH = 2048

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = Path(tmp, "hf")
        hf_dir.mkdir()
        # The same byte-level BPE recipe as the trained model, on the embedded corpus.
        train_tokenizer([CORPUS] * 4, VOCAB_SIZE, CONTEXT_LENGTH, hf_dir)
        build_llama(hf_dir)
        staged = Path(tmp, "onnx")
        export(hf_dir, staged, Path(tmp, "cache"), "fp32")
        install(staged, args.output)
    total = sum(p.stat().st_size for p in args.output.iterdir())
    print(f"wrote {args.output} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
