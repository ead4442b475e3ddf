"""What llama.cpp makes of SmolLM2-135M-Instruct, recorded for the real-model tier.

    .venv/bin/python scripts/smollm2_reference.py

It runs llama.cpp's `llama-server` (built as `python -m bench peers` builds it, from the
pinned llama-cpp-python sdist: bench/peers_setup.py) on the pinned GGUF that `make smollm2`
fetches, and on its F32 twin (`llama-quantize --allow-requantize ... F32`, llama.cpp's own
dequantization), and writes tests/realmodel/data/llama_cpp_reference.json:
- `tokenize`: the ids llama.cpp gives each string of CORPUS (special tokens parsed, no BOS);
- `greedy_f32`, `greedy_q4_1`: the first 32 tokens of each GREEDY_PROMPTS prompt, greedy,
  on each file;
- `answers_q4_1`, `answers_f32`: the answer to each FACTS question (chat, greedy) on each
  file, and whether it holds the expected word.
The tier compares inferwire's imports with it (tests/realmodel): the recording is what
lets CI check against llama.cpp without compiling it (about six minutes on two cores).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.peers_servers import llama_server  # noqa: E402
from bench.peers_setup import BUILD, SDIST_VERSION, setup, sha256_of  # noqa: E402
from scripts.smollm2 import GGUF, fetch_gguf  # noqa: E402
from tests.realmodel.corpus import CORPUS, FACTS, GREEDY_PROMPTS  # noqa: E402

OUT = REPO / "tests" / "realmodel" / "data" / "llama_cpp_reference.json"
F32_GGUF = GGUF.with_name("SmolLM2-135M-Instruct.F32.gguf")
GREEDY_TOKENS = 32


def f32_twin() -> Path:
    """The GGUF dequantized by llama.cpp itself."""
    if not F32_GGUF.is_file():
        subprocess.run(
            ["cmake", "--build", str(BUILD), "--target", "llama-quantize", "-j2"], check=True
        )
        subprocess.run(
            [str(BUILD / "bin" / "llama-quantize"), "--allow-requantize", str(GGUF),
             str(F32_GGUF), "F32"],
            check=True,
            capture_output=True,
        )  # fmt: skip
    return F32_GGUF


def tokenize(client: httpx.Client, text: str) -> list[int]:
    reply = client.post("/tokenize", json={"content": text, "add_special": False})
    reply.raise_for_status()
    return [int(t) for t in reply.json()["tokens"]]


def greedy(client: httpx.Client, prompt: str) -> list[int]:
    body = {
        "prompt": prompt,
        "n_predict": GREEDY_TOKENS,
        "temperature": 0,
        "top_k": 1,
        "repeat_penalty": 1.0,
        "cache_prompt": False,
        "return_tokens": True,
    }
    reply = client.post("/completion", json=body, timeout=120)
    reply.raise_for_status()
    return [int(t) for t in reply.json()["tokens"]]


def answer(client: httpx.Client, question: str) -> str:
    body = {
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 48,
        "temperature": 0,
        "top_k": 1,
        "repeat_penalty": 1.0,
    }
    reply = client.post("/v1/chat/completions", json=body, timeout=120)
    reply.raise_for_status()
    return str(reply.json()["choices"][0]["message"]["content"])


def record(binary: Path, gguf: Path, work: Path, what: str) -> dict[str, object]:
    log = work / f"llama-server-{what}.log"
    found: dict[str, object] = {}
    served = llama_server(binary, gguf, 1, 4096, 2, log, repeat_penalty=1.0, alias="smollm2")
    with served as server, httpx.Client(base_url=server.url, timeout=60) as client:
        if what == "q4_1":
            found["tokenize"] = [tokenize(client, text) for text in CORPUS]
        found[f"answers_{what}"] = [
            {"question": q, "expected": e, "answer": (a := answer(client, q)),
             "correct": e.lower() in a.lower()}
            for q, e in FACTS
        ]  # fmt: skip
        found[f"greedy_{what}"] = [greedy(client, prompt) for prompt in GREEDY_PROMPTS]
    return found


def main() -> None:
    tools = setup()
    gguf = fetch_gguf()
    reference: dict[str, object] = {
        "llama_cpp": f"llama-cpp-python {SDIST_VERSION} sdist (vendor/llama.cpp)",
        "gguf_sha256": sha256_of(gguf),
        "f32_gguf_sha256": sha256_of(f32_twin()),
        "greedy_tokens": GREEDY_TOKENS,
    }
    with tempfile.TemporaryDirectory() as work:
        reference |= record(tools.llama_server, gguf, Path(work), "q4_1")
        reference |= record(tools.llama_server, F32_GGUF, Path(work), "f32")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(reference, indent=1, ensure_ascii=False) + "\n")
    right = {
        what: sum(entry["correct"] for entry in reference[f"answers_{what}"])  # type: ignore[attr-defined]
        for what in ("q4_1", "f32")
    }
    print(
        f"{OUT}: {len(CORPUS)} strings, {len(GREEDY_PROMPTS)} greedy prompts; llama.cpp answers "
        f"{right['q4_1']} (Q4_1) and {right['f32']} (F32) of {len(FACTS)} questions"
    )


if __name__ == "__main__":
    main()
