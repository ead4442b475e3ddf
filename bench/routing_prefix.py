"""Routing conversations across replicas (issue 60): does llm-d's endpoint picker, scoring
prefix locality, make later turns' time to first token shorter than a prefix-blind picker
does, and which of its two prefix scorers does it better?

Three real replicas (bench/routing_cluster.py: `inferwire serve`, the continuous path,
KV events on, as tests/support/kv_routing.py starts them, on 127.0.0.11-13 with the same
ports) and the
real picker (llm-d v0.10, built by scripts/build_epp.sh), played as Envoy plays it over
ext-proc (tests/support/envoy.py): ask the picker, send the request to the replica it
names, streamed (`/v1/chat/completions`), tell the picker the response. Three picker
configurations, in the same run, on the same replicas, each with a picker of its own:

- `blind`: deploy/gateway/epp-config.yaml without its `prefix-cache-scorer` (the queue,
  KV-utilization and LoRA scorers only);
- `approximate`: epp-config.yaml as shipped (the prefix scorer hashing the request's
  characters and remembering where it sent them, weight 3);
- `precise`: the same weights with the prefix scorer fed by the `token-producer` (a
  replica's render route) and the `precise-prefix-cache-producer` (the replicas' KV
  events), as tests/gateway/test_precise_prefix.py configures it.

Each round plays CONVERSATIONS conversations at once under every configuration, the
configurations' order reversed every other round; each (round, configuration) has
conversations of its own (Shakespeare passages from the peers corpus, bench/peers_checks),
so nothing one left in a replica's cache helps another. A conversation begins
STAGGER_S after the one before, then sends its TURNS turns back to back, each appending a
user message of 80 words (~125 tokens) to the whole history and streaming REPLY_TOKENS greedy
tokens (`ignore_eos`), the reply appended as the assistant's message. Every conversation
opens on a system message of its own (a number and its first passage's first words), so
no two share more than the chat template's first tokens (a replica gives a new prompt
the free slot sharing over a tenth of its prefix, docs/deployment.md). Each replica has
a slot for each conversation (`max_concurrency` = CONVERSATIONS).

Measured: each turn's TTFT as the client sees it (from asking the picker to the first
streamed text, so the precise producer's render is inside it), which replica served it;
the later turns (LATER_TURNS_FROM on) pooled over rounds: TTFT p50 and p99, the share
landing on the replica that served the conversation's turn before; the replicas'
prompt-cache reuse (`inferwire_prompt_cache_reused_tokens` / `_prompt_tokens`, read from
each replica's metrics before and after each run), and CPU seconds of the replicas, the
picker and this process (/proc), with the load average before each run.

The model: SmolLM2-135M-Instruct's int4 import (`make smollm2`), one ONNX Runtime thread
per replica, not the bundled demo model (4 layers of width 256, a 1,024-token context):
a SmolLM2 step costs about 20 times the demo's (docs/benchmarks.md, `peers_smollm2`), so
on the demo a missed prefix costs almost nothing and the figures would say little about
routing, and five turns of 80 words nearly fill its context. Measured (`--quick`, one
round of 3 conversations x 3 turns, later turns' TTFT p50 blind / approximate / precise):
the demo (20-word messages) 22 / 21 / 20 ms, SmolLM2 1954 / 973 / 1042 ms. On SmolLM2 a
missed prefix at turn 5 is ~850 tokens to read again. INFERWIRE_ROUTING_MODEL=demo runs the scenario
on the demo (20-word messages), to check the plumbing without the import.

The machine has 2 cores: three replicas, the picker and this client share them, as
they would share nothing in a cluster; the figures compare the pickers with one another
on the same crowded machine, they do not say what one replica serves alone.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import httpx

from bench.common import (
    RunOptions,
    ScenarioResult,
    Series,
    at_least,
    at_most,
    percentile,
    ratio,
    write_plot,
)
from bench.peers_multiturn import chat_body
from bench.routing_cluster import (
    StreamingEnvoy,
    cpu_seconds,
    model_choice,
    picker_binary,
    picker_config,
    picker_ready,
    prompt_cache,
    replicas,
    start_picker,
    wait_replayed,
)
from tests.support import epp
from tests.support.kv_routing import ADDRESSES
from tests.support.process import (
    ServerProcess,
)

NAME = "routing_prefix"
REPO = Path(__file__).resolve().parents[1]
CONFIGS = ("blind", "approximate", "precise")
LABELS = {
    "blind": "prefix-blind (no prefix scorer)",
    "approximate": "approximate prefix scorer (as shipped)",
    "precise": "precise prefix scorer (KV events)",
}
CONVERSATIONS = 8
TURNS = 5
ROUNDS = 4
LATER_TURNS_FROM = 2  # turns 2..TURNS (1-based): each has a history a replica may hold
REPLY_TOKENS = 24
STAGGER_S = 0.5
MODEL_NOTES = {"smollm2": "int4 import, one thread per replica", "demo": "the bundled demo"}


# ---- conversations ----------------------------------------------------------------


def passages(words_each: int, needed: int) -> list[str]:
    """`needed` distinct passages of `words_each` words from the peers corpus sample."""
    from bench.peers_checks import corpus_sample
    from bench.peers_setup import CACHE, ensure_corpus

    CACHE.mkdir(parents=True, exist_ok=True)
    sdist = ensure_corpus(CACHE / "setup.log")
    words = " ".join(corpus_sample(sdist, chars=12_000)).split()
    found = [
        " ".join(words[i : i + words_each]) for i in range(0, len(words) - words_each, words_each)
    ]
    if len(found) < needed:
        raise RuntimeError(f"the corpus sample gives {len(found)} passages, not {needed}")
    return found[:needed]


def opening(number: int, first_passage: str) -> dict[str, str]:
    """A system message no other conversation's shares more than a few tokens with."""
    head = " ".join(first_passage.split()[:6])
    return {
        "role": "system",
        "content": f"{number}. {head}: you read these passages aloud and answer briefly.",
    }


async def conversation(
    gateway: StreamingEnvoy, model: str, number: int, questions: list[str], delay_s: float
) -> list[dict[str, Any]]:
    await asyncio.sleep(delay_s)
    messages = [opening(number, questions[0])]
    turns = []
    for question in questions:
        messages.append({"role": "user", "content": question})
        turn = await gateway.chat(chat_body(model, messages, REPLY_TOKENS))
        messages = [*messages, {"role": "assistant", "content": turn.pop("reply")}]
        turns.append(turn)
    return turns


async def play(
    picker: epp.PickerProcess, model: str, conversations: list[list[str]], first_number: int
) -> tuple[list[list[dict[str, Any]]], float]:
    """The conversations at once through `picker`; each one's turns, and the seconds."""
    async with (
        grpc.aio.insecure_channel(picker.ext_proc_target) as channel,
        httpx.AsyncClient(
            timeout=httpx.Timeout(600, connect=10), limits=httpx.Limits(max_connections=64)
        ) as http,
    ):
        gateway = StreamingEnvoy(channel, http)
        started = time.perf_counter()
        runs = await asyncio.gather(
            *(
                conversation(gateway, model, first_number + i, questions, i * STAGGER_S)
                for i, questions in enumerate(conversations)
            )
        )
        return list(runs), time.perf_counter() - started


async def run_one(
    binary: Path,
    directory: Path,
    kind: str,
    servers: dict[str, ServerProcess],
    ports: dict[str, int],
    model: str,
    conversations: list[list[str]],
    first_number: int,
) -> dict[str, Any]:
    """One configuration's picker over one round's conversations; its turns and readings."""
    endpoints = directory / "endpoints.yaml"
    pods = {
        f"pod-{ADDRESSES.index(e.split(':')[0])}": (e.split(":")[0], int(e.split(":")[1]))
        for e in servers
    }
    endpoints.write_text(epp.endpoints_yaml(pods, {epp.ENGINE_LABEL: "vllm"}))
    picker = start_picker(binary, directory, kind, picker_config(kind, endpoints, ports, model))
    try:
        if kind == "precise":
            wait_replayed(picker, len(ADDRESSES))
        await picker_ready(picker, model)
        load = [round(x, 2) for x in os.getloadavg()]
        pids = {**{e: s.process.pid for e, s in servers.items()}, "picker": picker.process.pid}
        pids["client"] = os.getpid()
        cache_before, cpu_before = prompt_cache(servers, ports["metrics"]), cpu_seconds(pids)
        runs, wall_s = await play(picker, model, conversations, first_number)
        cache_after, cpu_after = prompt_cache(servers, ports["metrics"]), cpu_seconds(pids)
    finally:
        status = epp.stop_picker(picker.process)
    if status != 0:
        raise RuntimeError(picker.exit_report())
    prompt = sum(cache_after[e][0] - cache_before[e][0] for e in servers)
    reused = sum(cache_after[e][1] - cache_before[e][1] for e in servers)
    return {
        "config": kind,
        "load_average_before": load,
        "wall_s": wall_s,
        "turns": runs,
        "prompt_cache": {"prompt_tokens": prompt, "reused_tokens": reused},
        "cpu_s": {name: round(cpu_after[name] - cpu_before[name], 2) for name in pids},
    }


# ---- summaries ----------------------------------------------------------------------


def summary(runs: list[dict[str, Any]], turns: int) -> dict[str, Any]:
    """One configuration's runs pooled: later turns' TTFT and landing, TTFT by turn."""
    conversations = [conv for run in runs for conv in run["turns"]]
    later = [
        conv[t]["ttft_ms"] for conv in conversations for t in range(LATER_TURNS_FROM - 1, turns)
    ]
    landed = [
        conv[t]["endpoint"] == conv[t - 1]["endpoint"]
        for conv in conversations
        for t in range(max(1, LATER_TURNS_FROM - 1), turns)
    ]
    prompt = sum(run["prompt_cache"]["prompt_tokens"] for run in runs)
    reused = sum(run["prompt_cache"]["reused_tokens"] for run in runs)
    per_replica: dict[str, int] = {}
    for conv in conversations:
        for turn in conv:
            per_replica[turn["endpoint"]] = per_replica.get(turn["endpoint"], 0) + 1
    return {
        "conversations": len(conversations),
        "later_turns": len(later),
        "later_turns_ttft_p50_ms": percentile(later, 0.5),
        "later_turns_ttft_p99_ms": percentile(later, 0.99),
        "later_turns_on_previous_replica": ratio(sum(landed), len(landed)),
        "ttft_p50_ms_by_turn": [
            percentile([conv[t]["ttft_ms"] for conv in conversations], 0.5) for t in range(turns)
        ],
        "prompt_tokens_by_turn": [
            max(conv[t]["prompt_tokens"] for conv in conversations) for t in range(turns)
        ],
        "picker_ms_p50": percentile(
            [turn["picker_ms"] for conv in conversations for turn in conv], 0.5
        ),
        "prompt_cache_reuse": ratio(reused, prompt),
        "turns_per_replica": per_replica,
        "wall_s": sum(run["wall_s"] for run in runs),
    }


async def all_runs(
    binary: Path,
    directory: Path,
    entry: dict[str, Any],
    model: str,
    texts: list[str],
    orders: list[list[str]],
    count: int,
    turns: int,
) -> dict[str, list[dict[str, Any]]]:
    """Every round, each configuration in the round's order, on the same three replicas;
    each (round, configuration) on conversations of its own."""
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in CONFIGS}
    with replicas(directory, entry) as (servers, ports):
        block = 0
        for round_index, order in enumerate(orders):
            for kind in order:
                first = block * count * turns
                conversations = [
                    texts[first + c * turns : first + (c + 1) * turns] for c in range(count)
                ]
                made = await run_one(
                    binary, directory, kind, servers, ports, model, conversations, block * count
                )
                made["round"] = round_index
                runs[kind].append(made)
                block += 1
                print(
                    f"  {NAME}: round {round_index} {kind}: {made['wall_s']:.1f} s, "
                    f"load {made['load_average_before']}",
                    flush=True,
                )
    return runs


def run(options: RunOptions) -> ScenarioResult:
    started = time.perf_counter()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    model, entry, user_words = model_choice()
    count = options.size(CONVERSATIONS, 3)
    turns = options.size(TURNS, 3)
    rounds = options.size(ROUNDS, 1)
    entry = {**entry, "max_concurrency": count}
    texts = passages(user_words, rounds * len(CONFIGS) * count * turns)
    binary = picker_binary()
    orders = [list(CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))) for r in range(rounds)]
    with tempfile.TemporaryDirectory() as scratch:
        runs = asyncio.run(
            all_runs(binary, Path(scratch), entry, model, texts, orders, count, turns)
        )
    summaries = {kind: summary(runs[kind], turns) for kind in CONFIGS}
    p50 = {kind: summaries[kind]["later_turns_ttft_p50_ms"] for kind in CONFIGS}
    p99 = {kind: summaries[kind]["later_turns_ttft_p99_ms"] for kind in CONFIGS}
    ratios = {
        "approximate_vs_blind_later_ttft_p50": ratio(p50["approximate"], p50["blind"]),
        "precise_vs_blind_later_ttft_p50": ratio(p50["precise"], p50["blind"]),
        "precise_vs_approximate_later_ttft_p50": ratio(p50["precise"], p50["approximate"]),
        "approximate_vs_blind_later_ttft_p99": ratio(p99["approximate"], p99["blind"]),
        "precise_vs_blind_later_ttft_p99": ratio(p99["precise"], p99["blind"]),
        "precise_vs_approximate_later_ttft_p99": ratio(p99["precise"], p99["approximate"]),
    }
    landing = summaries["precise"]["later_turns_on_previous_replica"]
    targets = [
        at_most(
            "approximate prefix scorer: later turns' TTFT p50 x the prefix-blind picker's",
            ratios["approximate_vs_blind_later_ttft_p50"],
            1.0,
        ),
        at_most(
            "precise prefix scorer: later turns' TTFT p50 x the prefix-blind picker's",
            ratios["precise_vs_blind_later_ttft_p50"],
            1.0,
        ),
        at_least("precise prefix scorer: later turns on the previous turn's replica", landing, 0.9),
    ]
    rows = [
        [
            LABELS[kind],
            f"{summaries[kind]['later_turns_ttft_p50_ms']:.0f}",
            f"{summaries[kind]['later_turns_ttft_p99_ms']:.0f}",
            f"{summaries[kind]['later_turns_on_previous_replica']:.2f}",
            f"{summaries[kind]['prompt_cache_reuse']:.2f}",
            " / ".join(f"{ms:.0f}" for ms in summaries[kind]["ttft_p50_ms_by_turn"]),
            f"{summaries[kind]['picker_ms_p50']:.1f}",
            f"{sum(sum(r['cpu_s'][e] for e in r['cpu_s'] if ':' in e) for r in runs[kind]):.0f}"
            f" / {sum(r['cpu_s']['picker'] for r in runs[kind]):.1f}",
        ]
        for kind in CONFIGS
    ]
    series = [
        Series(
            LABELS[kind],
            [float(t + 1) for t in range(turns)],
            summaries[kind]["ttft_p50_ms_by_turn"],
            baseline=kind == "blind",
        )
        for kind in CONFIGS
    ]
    write_plot(
        options,
        NAME,
        series,
        "turn",
        "TTFT p50 (ms)",
        f"{count} conversations at once over 3 replicas ({model})",
    )
    elapsed = time.perf_counter() - started
    notes = [
        f"Model: {model} ({MODEL_NOTES.get(model, '')}); "
        f"{count} conversations at once, {turns} turns, {user_words}-word user messages, "
        f"{REPLY_TOKENS} greedy tokens a reply, each turn resending the whole history; "
        f"{rounds} round(s), orders {orders}; each replica {count} slots.",
        f"Later turns: turn {LATER_TURNS_FROM} on, pooled over rounds "
        f"({summaries['blind']['later_turns']} per configuration). TTFT is the client's, from "
        "asking the picker (over ext-proc, as Envoy) to the first streamed text.",
        "Landing: the share of later turns served by the replica that served the "
        "conversation's turn before. Prompt-cache reuse: the replicas' reused / prompt "
        "tokens (inferwire_prompt_cache_*) over the configuration's runs.",
        "CPU s: the three replicas' / the picker's, over the configuration's runs (/proc).",
        f"Machine: {os.cpu_count()} CPUs; `uptime` at the start: {uptime}. The three "
        "replicas, the picker and the client share them.",
        f"The whole scenario took {elapsed:.0f} s.",
        f"Plot: {NAME}.png (TTFT p50 by turn).",
    ]
    return ScenarioResult(
        name=NAME,
        title="Conversations over 3 replicas: prefix-aware pickers against a prefix-blind one",
        baseline="llm-d's picker (v0.10) with deploy/gateway/epp-config.yaml's scorers less "
        "its prefix scorer (prefix-blind)",
        data={
            "model": model,
            "uptime_at_start": uptime,
            "load_average_at_start": load_at_start,
            "conversations": count,
            "turns": turns,
            "rounds": rounds,
            "orders": orders,
            "user_words": user_words,
            "reply_tokens": REPLY_TOKENS,
            "later_turns_from": LATER_TURNS_FROM,
            "stagger_s": STAGGER_S,
            "elapsed_s": elapsed,
            "summaries": summaries,
            "runs": runs,
        },
        ratios=ratios,
        table_header=[
            "picker",
            "later turns TTFT p50 ms",
            "p99 ms",
            "on previous replica",
            "prompt-cache reuse",
            "TTFT p50 by turn ms",
            "picker ms p50",
            "CPU s replicas / picker",
        ],
        table_rows=rows,
        targets=targets,
        notes=notes,
    )
