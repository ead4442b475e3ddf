"""Stage 3: a small Llama trained from scratch on the CPU."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from . import SEED
from .evaluation import torch_nll


@dataclass(frozen=True)
class Shape:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    context_length: int = 1024


@dataclass(frozen=True)
class Schedule:
    steps: int = 1000
    batch_tokens: int = 4096
    short_seq: int = 256
    # The last `long_fraction` of the steps train on full-context windows, so that
    # the whole context window the model declares has been seen in training.
    long_fraction: float = 0.12
    peak_lr: float = 2e-3
    min_lr: float = 1e-4
    warmup_steps: int = 40
    weight_decay: float = 0.1
    grad_clip: float = 1.0


# ---- training -------------------------------------------------------------------------


def build_model(shape: Shape):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.context_length,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def learning_rate(step: int, s: Schedule) -> float:
    if step < s.warmup_steps:
        return s.peak_lr * (step + 1) / s.warmup_steps
    progress = (step - s.warmup_steps) / max(1, s.steps - s.warmup_steps)
    return s.min_lr + 0.5 * (s.peak_lr - s.min_lr) * (1 + math.cos(math.pi * progress))


def train(model, train_ids, heldout_ids, shape: Shape, s: Schedule, log) -> dict:
    import torch

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": s.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=s.peak_lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    sampler = torch.Generator().manual_seed(SEED)
    data = torch.from_numpy(train_ids)
    long_start = s.steps - round(s.long_fraction * s.steps)
    started = time.perf_counter()
    tokens_seen = 0
    recent: list[float] = []
    history = []
    model.train()
    for step in range(s.steps):
        seq = shape.context_length if step >= long_start else s.short_seq
        batch = max(1, s.batch_tokens // seq)
        starts = torch.randint(0, len(data) - seq, (batch,), generator=sampler)
        x = torch.stack([data[i : i + seq] for i in starts.tolist()])
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, s)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens_seen += x.numel()
        recent = [*recent, loss.item()][-50:]
        if (step + 1) % 25 == 0 or step + 1 == s.steps:
            elapsed = time.perf_counter() - started
            line = (
                f"step {step + 1}/{s.steps} seq {seq} lr {learning_rate(step, s):.2e} "
                f"train loss {sum(recent) / len(recent):.3f} tokens {tokens_seen} "
                f"{tokens_seen / elapsed:.0f} tok/s elapsed {elapsed / 60:.1f} min"
            )
            if (step + 1) % 150 == 0 and step + 1 < s.steps:
                nll, count = torch_nll(model, heldout_ids, shape.context_length)
                line += f" held-out loss {nll / count:.3f} ppl {math.exp(nll / count):.1f}"
                history.append((step + 1, sum(recent) / len(recent), nll / count))
            log(line)
    return {
        "train_seconds": time.perf_counter() - started,
        "tokens_seen": tokens_seen,
        "final_train_loss": sum(recent) / len(recent),
        "history": history,
    }
