"""The real clients of the Open Inference Protocol, run as programs against a server:
tritonclient (tests/support/tritonclient_vllm.py, in this virtualenv) and the KServe
Python SDK (tests/support/kserve_sdk_client.py), in a virtualenv of its own, built once
under .cache/ from PyPI.

The SDK ships its own generated `inference` package (grpc_predict_v2.proto), which cannot
share a process with tritonclient's, and it pins dependencies of its own; so it gets a
separate virtualenv, and tests run it as a program (tests/support/kserve_sdk_client.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tritonclient.grpc import service_pb2 as oip

KSERVE_VERSION = "0.21.0"
ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".cache" / f"kserve-sdk-{KSERVE_VERSION}"
PYTHON = VENV / "bin" / "python"
CLIENT = Path(__file__).resolve().parent / "kserve_sdk_client.py"
# `-P`: the programs' own folder stays off sys.path, where tests/support's modules
# (dns.py, manifests.py, ...) would shadow the packages the SDKs import.
TRITONCLIENT_PROGRAM = Path(__file__).resolve().parent / "tritonclient_vllm.py"


def run_tritonclient_program(target: str, model: str, unary_model: str) -> dict:
    """The tritonclient program's report; it fails here with its traceback when a call failed."""
    result = subprocess.run(
        [sys.executable, "-P", str(TRITONCLIENT_PROGRAM), target, model, unary_model],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def kserve_python() -> Path:
    """The SDK's Python, installing it first when needed; skips when PyPI is out of reach."""
    stamp = VENV / ".installed"
    if stamp.is_file():
        return PYTHON
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    install = subprocess.run(
        [str(PYTHON), "-m", "pip", "install", "--quiet", f"kserve=={KSERVE_VERSION}"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if install.returncode != 0:
        pytest.skip(f"kserve=={KSERVE_VERSION} could not be installed: {install.stderr[-500:]}")
    stamp.touch()
    return PYTHON


def run_kserve_client(target: str, model: str) -> dict:
    result = subprocess.run(
        [str(kserve_python()), "-P", str(CLIENT), target, model],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def kserve_sdk_run(code: str, *args: str) -> str:
    """Run Python `code` (with `args`) where the SDK is importable; its standard output."""
    result = subprocess.run(
        [str(kserve_python()), "-c", code, *args], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def text_input(prompt: str, name: str = "text_input") -> oip.ModelInferRequest.InferInputTensor:
    tensor = oip.ModelInferRequest.InferInputTensor(name=name, datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(prompt.encode())
    return tensor


def bool_input(name: str, value: bool) -> oip.ModelInferRequest.InferInputTensor:
    tensor = oip.ModelInferRequest.InferInputTensor(name=name, datatype="BOOL", shape=[1])
    tensor.contents.bool_contents.append(value)
    return tensor


def kserve_request(
    prompt: str, sampling: dict | None = None, stream: bool = False, **kwargs
) -> oip.ModelInferRequest:
    inputs = [text_input(prompt), bool_input("stream", stream)]
    if sampling is not None:
        inputs.append(text_input(json.dumps(sampling), "sampling_parameters"))
    inputs.append(bool_input("exclude_input_in_output", True))
    for flag in ("return_finish_reason", "return_num_input_tokens", "return_num_output_tokens"):
        inputs.append(bool_input(flag, True))
    return oip.ModelInferRequest(model_name=kwargs.pop("model", "demo"), inputs=inputs, **kwargs)
