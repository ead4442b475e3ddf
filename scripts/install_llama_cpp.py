"""Install llama-cpp-python (the `llama-cpp` backend's engine) into this venv, built from
its PyPI sdist for this CPU: about 5 minutes on 2 cores the first time, then seconds.

PyPI has no CPU wheel of llama-cpp-python, so pip builds llama.cpp from the sdist. The
build is the library alone (no server, tools, tests or llava), native to this CPU except
for ggml's AMX kernels, which crash this llama.cpp on the 2-core VMs whose CPU reports
AMX (bench/peers_setup.py's `cpu_flags`, the same flags llama-server is built with). The
wheel is kept in ~/.cache/inferwire/llama-cpp/<key>/, the key naming the version and the
flags, so a second clone on the same machine installs in seconds; pip's own wheel cache
is not used, since it does not know the flags.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.peers_setup import cpu_flags  # noqa: E402

VERSION = "0.3.36"  # pyproject.toml's llama-cpp extra pins the same
FLAGS = (
    "-DLLAVA_BUILD=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_CUDA=OFF",
)


def cache_dir(flags: tuple[str, ...]) -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = hashlib.sha256(" ".join((VERSION, *flags)).encode()).hexdigest()[:16]
    return root / "inferwire" / "llama-cpp" / f"{VERSION}-{key}"


def main() -> int:
    flags = (*FLAGS, *cpu_flags())
    wheels = cache_dir(flags)
    pip = [sys.executable, "-m", "pip"]
    started = time.perf_counter()
    if not list(wheels.glob("llama_cpp_python-*.whl")):
        print(f"building llama-cpp-python {VERSION} ({' '.join(flags)}), about 5 minutes")
        wheels.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "CMAKE_ARGS": " ".join(flags)}
        command = [
            *pip, "wheel", "--quiet", "--no-deps", "--no-cache-dir",
            "--no-binary", "llama-cpp-python", "-w", str(wheels), f"llama-cpp-python=={VERSION}",
        ]  # fmt: skip
        subprocess.run(command, env=env, check=True)
    wheel = next(wheels.glob("llama_cpp_python-*.whl"))
    subprocess.run([*pip, "install", "--quiet", str(wheel)], check=True)
    took = time.perf_counter() - started
    print(f"llama-cpp-python {VERSION} installed from {wheel} in {took:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
