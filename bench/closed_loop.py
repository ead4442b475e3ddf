"""What the closed-loop CPU runs share (engines_smollm2.py and the engines it drives
directly: peers_og.py, and peers_openvino.py, which runs in OpenVINO's venv): the prompts
and the /proc readings. Standard library only, so that every venv imports it."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path

PROMPT_TOKENS = (56, 64)  # a prompt's least and most tokens

SENTENCES = [
    "The river bends twice before it reaches the old stone mill at the edge of town.",
    "Most bakeries start their ovens long before the first bus leaves the depot.",
    "A good map shows not only the roads but also the places where they flood in spring.",
    "She kept a notebook of every bird she saw from the kitchen window.",
    "The committee postponed the vote until the budget figures were checked again.",
    "He learned to sail on a lake so small that every tack felt like a turn.",
    "The recipe calls for two cups of flour, a pinch of salt, and patience.",
    "Engineers tested the bridge by driving loaded trucks across it one by one.",
    "Our neighbour grows tomatoes against the south wall, where the bricks stay warm.",
    "A steady rain fell through the night and filled the gutters by morning.",
    "The train was late, so the passengers shared stories on the cold platform.",
    "The lighthouse keeper wrote down the weather at noon and at midnight.",
    "The market sells fresh fish in the morning and flowers in the afternoon.",
    "Please describe, in a few short paragraphs, what happens next in this story.",
    "Summarise the main points above and suggest one question worth asking.",
    "Explain the situation to a child who has never visited such a place.",
    "Write a short reply that a helpful neighbour might send after reading this.",
    "List three things a visitor should know before arriving for the first time.",
]


def prompt_texts(count: int, seed: int, tokens_of: Callable[[str], int]) -> list[str]:
    """`count` distinct prompts of PROMPT_TOKENS tokens (`tokens_of` counts a text's, on
    the engine's own tokenizer), each a run of the shuffled SENTENCES."""
    least, most = PROMPT_TOKENS
    rng, prompts = random.Random(seed), []
    while len(prompts) < count:
        text, length = "", 0
        for sentence in rng.sample(SENTENCES, len(SENTENCES)):
            text = f"{text} {sentence}".strip()
            length = tokens_of(text)
            if length >= least:
                break
        if length <= most and text not in prompts:
            prompts.append(text)
    return prompts


def process_cpu_s(pid: int | str = "self") -> float:
    """A process's user and system CPU seconds (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """Busy seconds of all CPUs since boot (user, nice, system, irq, softirq), /proc/stat."""
    user, nice, system, _idle, _iowait, irq, softirq = Path("/proc/stat").read_text().split()[1:8]
    return sum(map(int, (user, nice, system, irq, softirq))) / os.sysconf("SC_CLK_TCK")
