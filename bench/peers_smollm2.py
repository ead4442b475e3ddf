"""`peers` on a real model: SmolLM2-135M-Instruct, inferwire's int4 import against
llama-server on the Q4_1 GGUF it was imported from (`make smollm2`), under the same aiperf
profile as `peers` (bench/peers.py): chat and completions, 64 tokens in, 128 out, greedy,
`ignore_eos`, concurrency 1, 8 and 32, and ghz on gRPC beside it; one round of the demo
run's requests or fewer (each server still meets each load, in a rotated order): 16 at
concurrency 1, where a cell of 8 requests (28 s) moved by 10% from run to run. Its result
stands beside the demo model's (bench/results/peers_smollm2.*)."""

from __future__ import annotations

import subprocess
import sys

from bench.common import RunOptions, ScenarioResult
from bench.peers import PeerModel
from bench.peers import run as run_peers
from scripts.smollm2 import GGUF, MODELS, REPO

NAME = "peers_smollm2"


def smollm2() -> PeerModel:
    """The int4 import and its GGUF, made (or reused) by scripts/smollm2.py."""
    subprocess.run([sys.executable, str(REPO / "scripts" / "smollm2.py")], check=True)
    path = MODELS / "smollm2"
    return PeerModel(
        "smollm2",
        path,
        str(path),
        GGUF,
        1.0,
        "SmolLM2-135M-Instruct; inferwire: its int4 import, llama.cpp: the Q4_1 GGUF",
        requests=((1, 16), (8, 24), (32, 48)),
        rounds=1,
    )


def run(options: RunOptions) -> ScenarioResult:
    return run_peers(options, smollm2(), NAME)
