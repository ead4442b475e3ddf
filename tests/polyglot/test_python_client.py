"""The Python client as a user gets it: the `inferwire-client` wheel built from
clients/python, installed into a fresh venv that has none of the server's code, and
clients/python/example.py run with that venv's python against a live server."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import inferwire
from inferwire.v1 import inference_pb2 as pb
from tests.support.polyglot import (
    ADAPTER_MODEL,
    CLIENTS,
    assert_chat_logprobs_output,
    assert_example_output,
    run_checked,
)

PYTHON_CLIENT = CLIENTS / "python"
STUB_FILES = {"inference_pb2.py", "inference_pb2.pyi", "inference_pb2_grpc.py", "py.typed"}


@pytest.fixture(scope="session")
def client_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("python-client-dist")
    run_checked(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(PYTHON_CLIENT)],
        cwd=dist,
        timeout=300,
    )
    (wheel,) = dist.glob("inferwire_client-0.1.0-*.whl")
    return wheel


@pytest.fixture(scope="session")
def client_python(tmp_path_factory: pytest.TempPathFactory, client_wheel: Path) -> Path:
    """A fresh venv holding the wheel and its dependencies (from PyPI), nothing else."""
    venv = tmp_path_factory.mktemp("python-client-venv")
    run_checked([sys.executable, "-m", "venv", str(venv)], cwd=venv, timeout=120)
    python = venv / "bin" / "python"
    # -I everywhere: no PYTHONPATH (which may point at server/), no user site, and
    # no script directory on sys.path (clients/python holds a source copy of the stubs).
    install = ["install", "--quiet", "--prefer-binary", str(client_wheel)]
    run_checked([str(python), "-I", "-m", "pip", *install], cwd=venv, timeout=480)
    return python


@pytest.mark.timeout(600)  # a cold pip install downloads grpcio and protobuf
def test_python_example_runs_from_the_client_wheel_without_the_server(
    live_server, chat_reference: pb.InferResponse, client_python: Path, tmp_path: Path
) -> None:
    engine = subprocess.run(
        [str(client_python), "-I", "-c", "import onnxruntime_genai"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert engine.returncode != 0 and "ModuleNotFoundError" in engine.stderr, engine
    import_stubs = "import inferwire.v1.inference_pb2_grpc as m; print(m.__file__)"
    stubs = run_checked([str(client_python), "-I", "-c", import_stubs], cwd=tmp_path, timeout=60)
    assert Path(stubs.stdout.strip()).is_relative_to(client_python.parents[1]), stubs.stdout

    example = [str(client_python), "-I", str(PYTHON_CLIENT / "example.py")]
    result = run_checked([*example, live_server.target, "demo"], cwd=tmp_path, timeout=60)
    assert_example_output(result.stdout)
    assert_chat_logprobs_output(result.stdout, chat_reference)
    adapter = run_checked([*example, live_server.target, ADAPTER_MODEL], cwd=tmp_path, timeout=60)
    assert_example_output(adapter.stdout, ADAPTER_MODEL)

    # Round robin over every address of a DNS name, as over a headless Service's replicas.
    spread = ["--lb", "round_robin", f"dns:///localhost:{live_server.port}", "demo"]
    result = run_checked([*example, *spread], cwd=tmp_path, timeout=60)
    assert_example_output(result.stdout)


def test_server_package_wins_over_the_client_wheel_when_both_are_importable(
    client_wheel: Path, tmp_path: Path
) -> None:
    with zipfile.ZipFile(client_wheel) as wheel:
        names = {name for name in wheel.namelist() if name.startswith("inferwire/")}
        wheel.extractall(tmp_path)
    # A namespace portion: inferwire/v1 only, no inferwire/__init__.py.
    assert names == {f"inferwire/v1/{name}" for name in STUB_FILES}, names

    # The wheel's portion goes first on sys.path, the worst case for the server; the
    # regular package still wins, whatever the path order, and brings its own stubs.
    probe = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); "
        "import inferwire, inferwire.v1.inference_pb2_grpc as m; "
        "print(inferwire.__file__); print(m.__file__)"
    )
    result = run_checked([sys.executable, "-c", probe], cwd=tmp_path, timeout=60)

    package, stubs = map(Path, result.stdout.split())
    server = Path(inferwire.__file__).parent
    assert package == server / "__init__.py", result.stdout
    assert stubs == server / "v1" / "inference_pb2_grpc.py", result.stdout
