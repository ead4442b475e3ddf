"""A random-weight Llama in Hugging Face format, with a tokenizer made here: no network.

Shapes (`--shape`):
- `llama-1b`: Llama-3.2-1B's (hidden 2048, 16 layers, 32 heads, 8 KV heads, MLP 8192,
  vocabulary 128,256, tied embeddings), with a 4,096-token context instead of 131,072 so
  that a static batch of 64 rows fits its KV cache (the decode step reads the same weights);
- `tiny`: hidden 64, 2 layers, same vocabulary and tokenizer, for a CPU dry run.

The tokenizer is synthetic, since Llama 3's cannot be downloaded: a byte-level BPE whose
128,000 ordinary tokens are the 256 bytes, every pair of 96 printable characters and then
character triples, followed by Llama 3's 256 special tokens (128000 begin_of_text,
128001 end_of_text, then reserved). So every id the model can produce decodes to real
text, and the vocabulary, embedding and LM head have Llama 3's sizes.

EOS: inferwire has no ignore-EOS option (and ONNX Runtime GenAI refuses an eos_token_id
outside the vocabulary), so the LM head's row for end_of_text is zero: its logit is always
0, while the largest of the other 128,255 random logits is positive, so greedy decoding
never picks it and every request runs to max_tokens (the measurement checks that).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SEED = 20261201
VOCAB_SIZE = 128_256
ORDINARY_TOKENS = 128_000
BOS_ID = 128_000
EOS_ID = 128_001
CONTEXT_LENGTH = 4096

SHAPES: dict[str, dict[str, Any]] = {
    "llama-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "tie_word_embeddings": True,
    },
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "tie_word_embeddings": True,
    },
}


def special_tokens() -> list[str]:
    reserved = [f"<|reserved_special_token_{i}|>" for i in range(VOCAB_SIZE - ORDINARY_TOKENS - 2)]
    return ["<|begin_of_text|>", "<|end_of_text|>", *reserved]


def bpe_vocabulary() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level BPE of ORDINARY_TOKENS tokens: bytes, printable pairs, then triples."""
    from tokenizers.pre_tokenizers import ByteLevel

    byte_chars = sorted(ByteLevel.alphabet(), key=_byte_of)
    vocab = {char: i for i, char in enumerate(byte_chars)}
    printable = [byte_chars[b] for b in [*range(32, 127), ord("\n")]]
    merges: list[tuple[str, str]] = []
    pairs = [a + b for a in printable for b in printable]
    for pair in pairs:
        merges.append((pair[0], pair[1]))
        vocab[pair] = len(vocab)
    for pair in pairs:
        for char in printable:
            if len(vocab) == ORDINARY_TOKENS:
                return vocab, merges
            merges.append((pair, char))
            vocab[pair + char] = len(vocab)
    raise AssertionError("not enough triples")


def _byte_of(char: str) -> int:
    """GPT-2's byte-to-character map, inverted: printable bytes map to themselves."""
    code = ord(char)
    if 33 <= code <= 126 or 161 <= code <= 172 or 174 <= code <= 255:
        return code
    low = [b for b in range(256) if not (33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255)]
    return low[code - 256]


def write_tokenizer(out_dir: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab, merges = bpe_vocabulary()
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in special_tokens()])
    assert tokenizer.get_vocab_size() == VOCAB_SIZE
    assert tokenizer.token_to_id("<|end_of_text|>") == EOS_ID
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        model_max_length=CONTEXT_LENGTH,
    )
    fast.save_pretrained(out_dir)
    # ONNX Runtime GenAI picks its tokenizer implementation from this class.
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "GPT2Tokenizer"
    config["add_bos_token"] = False
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def write_model(shape: str, out_dir: Path) -> int:
    """Random weights in Llama's initialisation; returns the parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=CONTEXT_LENGTH,
        rope_theta=500_000.0,
        rms_norm_eps=1e-5,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        **SHAPES[shape],
    )
    # On a GPU host, initialise there: 1.2 billion normal draws take a while on a CPU.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float32 if shape == "tiny" else torch.bfloat16
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype).eval()
        with torch.no_grad():
            model.get_output_embeddings().weight[EOS_ID].zero_()
    model.save_pretrained(out_dir)
    return sum(p.numel() for p in model.parameters())


def decode_step_bytes(shape: str, bytes_per_weight: int) -> int:
    """Weight bytes one decode step reads: every layer, the final norm and the LM head
    (the embedding lookup reads one row; with tied embeddings it is the LM head)."""
    s = SHAPES[shape]
    hidden, layers = s["hidden_size"], s["num_hidden_layers"]
    q = s["num_attention_heads"] * s["head_dim"]
    kv = s["num_key_value_heads"] * s["head_dim"]
    attention = hidden * q + 2 * hidden * kv + q * hidden
    mlp = 3 * hidden * s["intermediate_size"]
    per_layer = attention + mlp + 2 * hidden  # two RMSNorm weights
    weights = layers * per_layer + hidden + VOCAB_SIZE * hidden
    return weights * bytes_per_weight


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(args.out)
    parameters = write_model(args.shape, args.out)
    print(f"wrote {args.out}: {args.shape}, {parameters:,} parameters")


if __name__ == "__main__":
    main()
