"""The `peers` scenario's multi-turn chat: what a chat or agent user feels, the time to
first token of each new turn of a growing conversation.

CONVERSATIONS conversations at once, TURNS turns each, driven through the OpenAI chat API
the same way against every server: each turn appends a user message (a corpus passage
of about USER_WORDS words) to the whole history, streams a greedy reply of REPLY_TOKENS
tokens (`ignore_eos`), and appends the reply as the assistant's message. So turn k's
prompt holds every earlier turn: a server that computes the whole prompt again pays for
the history at every turn, one that keeps the conversation's KV (llama-server's
`cache_prompt`, inferwire's llama-cpp slots) pays for the new messages only. A run may
play several rounds, each with conversations of its own (`user_messages(texts, round)`),
and pool them (`summary`).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

from bench.common import percentile

CONVERSATIONS = 4
TURNS = 6
USER_WORDS = 40
REPLY_TOKENS = 64
LATER_TURNS_FROM = 3  # turns 3..TURNS are "later" (1-based): at least two turns of history


def user_messages(texts: list[str], round_index: int = 0) -> list[list[str]]:
    """Each conversation's user messages: consecutive corpus passages, distinct per turn
    and per round (a round's conversations are not in any server's cache)."""
    words = " ".join(texts).split()
    passages = [
        " ".join(words[i : i + USER_WORDS]) for i in range(0, len(words) - USER_WORDS, USER_WORDS)
    ]
    first = round_index * CONVERSATIONS * TURNS
    needed = first + CONVERSATIONS * TURNS
    if len(passages) < needed:
        raise RuntimeError(f"the corpus sample gives {len(passages)} passages, not {needed}")
    return [passages[first + c * TURNS : first + (c + 1) * TURNS] for c in range(CONVERSATIONS)]


def chat_body(model: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    """A turn's request: greedy, `max_tokens` whatever the model says, streamed with usage."""
    return {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def read_event(line: str) -> tuple[int | None, list[str]]:
    """One line of a chat stream: its usage's prompt tokens (None without), its texts."""
    if not line.startswith("data: ") or line == "data: [DONE]":
        return None, []
    chunk = json.loads(line[6:])
    usage = chunk.get("usage")
    texts = [
        text
        for choice in chunk.get("choices") or ()
        if (text := (choice.get("delta") or {}).get("content"))
    ]
    return (int(usage["prompt_tokens"]) if usage else None), texts


async def _turn(
    client: httpx.AsyncClient, url: str, model: str, messages: list[dict[str, str]]
) -> tuple[float, str, int]:
    """One streamed reply: its time to first token (s), its text, its prompt's tokens."""
    body = chat_body(model, messages, REPLY_TOKENS)
    started, first, pieces, prompt_tokens = time.perf_counter(), 0.0, [], 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            counted, texts = read_event(line)
            prompt_tokens = counted if counted is not None else prompt_tokens
            if texts:
                first = first or time.perf_counter()
                pieces += texts
    if not first:
        raise RuntimeError(f"{url}: a turn streamed no text")
    return first - started, "".join(pieces), prompt_tokens


async def _conversation(
    client: httpx.AsyncClient, url: str, model: str, questions: list[str]
) -> list[dict[str, Any]]:
    messages: list[dict[str, str]] = []
    turns = []
    for question in questions:
        messages.append({"role": "user", "content": question})
        ttft, reply, prompt_tokens = await _turn(client, url, model, messages)
        messages.append({"role": "assistant", "content": reply})
        turns.append({"ttft_ms": ttft * 1e3, "prompt_tokens": prompt_tokens})
    return turns


async def _all(url: str, model: str, conversations: list[list[str]]) -> list[list[dict[str, Any]]]:
    timeout = httpx.Timeout(600, connect=10)
    async with httpx.AsyncClient(timeout=timeout) as client:
        return list(
            await asyncio.gather(*(_conversation(client, url, model, q) for q in conversations))
        )


def play(
    url: str, model: str, conversations: list[list[str]]
) -> tuple[list[list[dict[str, Any]]], float]:
    """One round: `conversations` at once; each one's turns, and the round's seconds."""
    started = time.perf_counter()
    runs = asyncio.run(_all(url, model, conversations))
    return runs, time.perf_counter() - started


def summary(runs: list[list[dict[str, Any]]], wall_s: float) -> dict[str, Any]:
    """Every turn's TTFT and prompt length (all rounds' conversations together); p50 per
    turn and over the later turns."""
    by_turn = [[conv[t]["ttft_ms"] for conv in runs] for t in range(TURNS)]
    later = [ms for turn in by_turn[LATER_TURNS_FROM - 1 :] for ms in turn]
    return {
        "wall_s": wall_s,
        "conversations": len(runs),
        "ttft_p50_ms_by_turn": [percentile(turn, 0.5) for turn in by_turn],
        "prompt_tokens_by_turn": [
            max(conv[t]["prompt_tokens"] for conv in runs) for t in range(TURNS)
        ],
        "later_turns_ttft_p50_ms": percentile(later, 0.5),
        "later_turns_ttft_p99_ms": percentile(later, 0.99),
        "growth_last_over_second": (
            percentile(by_turn[-1], 0.5) / percentile(by_turn[1], 0.5) if by_turn[1] else 0.0
        ),
    }
