"""The pure parts of the `peers` benchmark (bench/peers_*.py): no llama.cpp, no aiperf.

aiperf's artifacts are read the way the scenario reads them, from files shaped as aiperf
0.13 writes them; the committed GGUF is checked against its committed sha256; the servers'
command lines carry the sampling and sizes that make the comparison fair.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.peers_aiperf import (
    AiperfRun,
    CpuSampler,
    _Series,
    aiperf_command,
    parse_run,
    summarize_runs,
)
from bench.peers_multiturn import CONVERSATIONS, TURNS, USER_WORDS, summary, user_messages
from bench.peers_servers import llama_server_command
from bench.peers_setup import GGUF, PeersSetupError, check_gguf, expected_sha256, sha256_of


def _record(phase: str, ttft: float, itl: float, tokens: int) -> dict[str, object]:
    return {
        "metadata": {"benchmark_phase": phase, "request_start_ns": 1},
        "metrics": {
            "time_to_first_token": {"value": ttft, "unit": "ms"},
            "inter_token_latency": {"value": itl, "unit": "ms"},
            "output_token_count": {"value": tokens, "unit": "tokens"},
        },
    }


def _artifacts(tmp_path: Path) -> Path:
    phases = [
        {"phase_kind": "warmup", "start_ns": 0, "end_ns": 10, "error_request_count": 0},
        {
            "phase_kind": "profiling",
            "start_ns": 2_000_000_000,
            "end_ns": 4_000_000_000,
            "error_request_count": 1,
        },
    ]
    (tmp_path / "phase_manifest.json").write_text(json.dumps({"phases": phases}))
    summary = {"output_token_throughput": {"unit": "tokens/sec", "avg": 250.0}}
    (tmp_path / "profile_export_aiperf.json").write_text(json.dumps(summary))
    records = [
        _record("warmup", 900.0, 9.0, 128),
        _record("profiling", 10.0, 1.0, 128),
        _record("profiling", 30.0, 3.0, 128),
        {**_record("profiling", 1.0, 1.0, 0), "error": {"code": 500}},
    ]
    (tmp_path / "profile_export.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    return tmp_path


def test_only_the_profiling_phases_successful_requests_are_counted(tmp_path: Path) -> None:
    run = parse_run(_artifacts(tmp_path))
    assert run.ttft_ms == [10.0, 30.0]
    assert run.itl_ms == [1.0, 3.0]
    assert run.tokens == 256
    assert run.wall_s == 2.0
    assert run.errors == 1
    assert run.reported_tokens_per_s == 250.0


def test_rounds_pool_their_requests_and_windows() -> None:
    runs = [
        AiperfRun(0, 1_000_000_000, [10.0], [1.0], [128], 0, 128.0),
        AiperfRun(0, 3_000_000_000, [30.0, 20.0], [3.0, 2.0], [128, 120], 0, 82.7),
    ]
    summary = summarize_runs(runs)
    assert summary["requests"] == 3
    assert summary["tokens_per_s"] == pytest.approx(376 / 4.0)
    assert summary["ttft_p50_ms"] == 20.0
    assert summary["ttft_p99_ms"] == 30.0
    assert (summary["min_output_tokens"], summary["max_output_tokens"]) == (120, 128)


def test_cpu_readings_are_interpolated_at_a_window_edge() -> None:
    series = _Series([0, 100, 200], [{"total": 0.0}, {"total": 50.0}, {"total": 150.0}])
    assert series.at(150) == {"total": 100.0}
    assert series.at(-5) == {"total": 0.0}
    assert series.at(500) == {"total": 150.0}


def test_a_load_tools_cpu_from_its_start_to_its_exit_is_in_its_window() -> None:
    """A process added as it starts and read once more after it ended, before it is
    reaped (as ghz is): its whole CPU time falls in the window, none before or after."""
    busy = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    with CpuSampler() as sampler:
        start_ns = time.time_ns()
        process = subprocess.Popen([sys.executable, "-c", busy])
        sampler.add_tree("tool", process.pid)
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
        end_ns = time.time_ns()
        sampler.sample_now()
        _, status, usage = os.wait4(process.pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        measured_us = sampler.between("tool", start_ns, end_ns)["total"]
    used_us = (usage.ru_utime + usage.ru_stime) * 1e6
    # Clock ticks (10 ms) round each reading.
    assert used_us - 20_000 <= measured_us <= used_us + 20_000, (measured_us, used_us)


def test_aiperf_asks_both_servers_for_the_same_greedy_fixed_length_stream(tmp_path: Path) -> None:
    command = aiperf_command(
        Path("aiperf"), "http://127.0.0.1:1", "chat", 8, 64, 64, 128, tmp_path, tmp_path
    )
    joined = " ".join(command)
    for part in (
        "--endpoint-type chat",
        "--streaming",
        "--isl 64 --isl-stddev 0",
        "--osl 128 --osl-stddev 0",
        "ignore_eos:true",
        "temperature:0",
        "--concurrency 8",
        "--use-server-token-count",
    ):
        assert part in joined


def test_llama_server_samples_as_the_bundled_model_and_sizes_every_slot() -> None:
    command = llama_server_command(Path("llama-server"), Path("m.gguf"), 9, 32, 208, 2)
    flags = dict(zip(command[1::2], command[2::2], strict=False))
    assert flags["--parallel"] == "32"
    assert flags["--ctx-size"] == str(32 * 208)
    assert flags["--repeat-penalty"] == "1.2"
    assert flags["--repeat-last-n"] == "208"  # the whole slot: every prompt and output
    assert "--jinja" in command
    assert flags["--threads"] == flags["--threads-batch"] == "2"


def test_the_committed_gguf_matches_its_committed_sha256() -> None:
    assert check_gguf() == expected_sha256() == sha256_of(GGUF)


def test_a_changed_gguf_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / GGUF.name
    copy.write_bytes(GGUF.read_bytes()[:1000])
    copy.with_name(copy.name + ".sha256").write_text(f"{expected_sha256()}  {copy.name}\n")
    with pytest.raises(PeersSetupError, match="sha256"):
        check_gguf(copy)


def test_llama_server_cpu_flags_are_native_unless_the_cpu_reports_amx():
    from bench.peers_setup import cpu_flags

    assert cpu_flags("flags\t: fpu avx avx2 fma f16c bmi2 avx512f\n") == ()
    flags = cpu_flags("flags\t: fpu avx avx2 fma f16c bmi2 avx512f avx512_vnni amx_tile amx_int8\n")
    assert flags[0] == "-DGGML_NATIVE=OFF"
    assert "-DGGML_AVX512=ON" in flags and "-DGGML_AVX512_VNNI=ON" in flags
    assert not any("AMX" in flag for flag in flags)


def test_each_multiturn_round_has_passages_of_its_own() -> None:
    texts = [" ".join(f"w{i}" for i in range(10 * CONVERSATIONS * TURNS * USER_WORDS))]
    first, second = user_messages(texts, 0), user_messages(texts, 1)
    assert [len(conversation) for conversation in first] == [TURNS] * CONVERSATIONS
    passages = [p for conversation in first + second for p in conversation]
    assert len(set(passages)) == 2 * CONVERSATIONS * TURNS
    with pytest.raises(RuntimeError, match="passages"):
        user_messages(texts, 10)


def test_multiturn_rounds_pool_every_conversation_turn_by_turn() -> None:
    def conversation(scale: float) -> list[dict[str, float]]:
        return [{"ttft_ms": scale * (t + 1), "prompt_tokens": 100 * (t + 1)} for t in range(TURNS)]

    one_round = [conversation(1.0), conversation(3.0)]
    another = [conversation(2.0), conversation(2.0)]
    pooled = summary(one_round + another, wall_s=7.0)
    assert pooled["conversations"] == 4
    assert pooled["wall_s"] == 7.0
    assert pooled["ttft_p50_ms_by_turn"][1] == 4.0  # turn 2 of scales 1, 2, 2, 3
    assert pooled["growth_last_over_second"] == TURNS / 2
    assert pooled["prompt_tokens_by_turn"][-1] == 100 * TURNS
