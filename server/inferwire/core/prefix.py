"""How many first tokens two prompts share: the part of a new prompt whose KV a free slot
or a saved prompt already holds (the continuous path and the llama-cpp backend)."""

from __future__ import annotations


def shared_prefix(cached: list[int], prompt: list[int]) -> int:
    """How many first tokens `cached` and `prompt` share. A binary search over slices: list
    comparison runs in C, so a long shared history costs a few compares, not a Python step
    per token (this runs for each free slot on each admission)."""
    low, high = 0, min(len(cached), len(prompt))
    while low < high:
        middle = (low + high + 1) // 2
        if cached[:middle] == prompt[:middle]:
            low = middle
        else:
            high = middle - 1
    return low
