"""Stage 2: the byte-level BPE tokenizer, and the works as token ids."""

from __future__ import annotations

import json
from pathlib import Path

EOS_TOKEN = "<|endoftext|>"
WORK_SEPARATOR = "\n\n\n"


def train_tokenizer(texts: list[str], vocab_size: int, context_length: int, out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        model_max_length=context_length,
    )
    fast.save_pretrained(out_dir)
    # ONNX Runtime GenAI picks its tokenizer implementation from this class.
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "GPT2Tokenizer"
    config["add_bos_token"] = False
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return tokenizer


def encode_works(tokenizer, works: list[str]):
    import numpy as np

    separator = tokenizer.encode(WORK_SEPARATOR).ids
    ids: list[int] = []
    for i, encoding in enumerate(tokenizer.encode_batch(works)):
        if i:
            ids.extend(separator)
        ids.extend(encoding.ids)
    return np.asarray(ids, dtype=np.int64)
