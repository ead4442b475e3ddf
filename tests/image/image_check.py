"""Build deploy/Dockerfile, run the image locked down, and probe it from outside.

    .venv/bin/python -m tests.image.image_check   (as root; `make test-image` runs it via pytest)
    python3 -m tests.image.image_check --prepare  (only the apt packages and the base tarball)

Only the standard library at import: .ci/run starts `--prepare` with the system python3
before the virtualenv exists. The Triton run (triton_check.py) needs the virtualenv and
`make triton`; main() imports it when it gets there.

Steps: install Debian's docker.io and mmdebstrap with apt when missing; start
`dockerd` by hand (pidfile, log file, poll `docker info`) unless an engine already
answers; build a local Debian base with `mmdebstrap --variant=minbase` (python3,
python3-venv, ca-certificates; the tarball is cached under .cache/image/), since
public images cannot be pulled here; build the image on it with BuildKit (the host's
CA bundle goes in as a build secret, so pip works behind a TLS-intercepting proxy
and no certificate reaches the image); run it with `--read-only`, `--cap-drop ALL`,
the image's non-root user and random loopback host ports; probe it with the real
grpc_health_probe ("" and model/demo), grpcurl (an Infer through reflection), an
HTTP scrape of /metrics and an OpenAI Completions call on port 8000; stop it (SIGTERM
must drain to exit code 0). Then run it once more as the Kubernetes Triton overlay does,
a Triton model found through DNS, against a real tritonserver on the host
(triton_check.py). Finally stop dockerd, if this script
started it, by PID. It prints the image size and the time each step took.

`Unavailable` means Docker cannot be used here (not root, apt fails, dockerd does not
start): the test skips on it. Anything that fails once the engine is up raises
`AssertionError` or `subprocess.CalledProcessError`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "image"
# Debian's CLI: BuildKit with this daemon (a preinstalled one may lack it).
DOCKER = "/usr/bin/docker"
DOCKERD = "/usr/sbin/dockerd"
IMAGE = "inferwire:image-check"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
TOOLS_BIN = REPO / ".tools" / "bin"


class Unavailable(Exception):
    """Docker cannot be used on this machine; the reason is the message."""


def log(message: str) -> None:
    print(f"[image] {message}", flush=True)


@contextmanager
def step(name: str, timings: dict[str, float]) -> Iterator[None]:
    start = time.monotonic()
    log(f"{name} ...")
    try:
        yield
    finally:
        timings[name] = time.monotonic() - start
        log(f"{name}: {timings[name]:.1f} s")


def run(
    args: list[str],
    timeout: float = 600,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> str:
    """Run a command; on failure raise with its whole output."""
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    if result.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited {result.returncode}\n"
            f"--- stdout ---\n{result.stdout[-6000:]}\n--- stderr ---\n{result.stderr[-6000:]}"
        )
    return result.stdout


def docker(*args: str, timeout: float = 600) -> str:
    return run([DOCKER, *args], timeout=timeout)


def codename() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip('"')
    raise Unavailable("/etc/os-release has no VERSION_CODENAME: not a Debian-like host")


def install_packages() -> None:
    if os.geteuid() != 0:
        raise Unavailable("not root: cannot install docker.io or start dockerd")
    if not shutil.which("apt-get"):
        raise Unavailable("no apt-get: cannot install docker.io and mmdebstrap")
    missing = [
        package
        for package, binary in (("docker.io", DOCKERD), ("mmdebstrap", "/usr/bin/mmdebstrap"))
        if not Path(binary).exists()
    ]
    if not missing:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]
    if subprocess.run(install, capture_output=True, env=env, timeout=600).returncode != 0:
        update = subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=600)
        result = subprocess.run(install, capture_output=True, text=True, env=env, timeout=600)
        if update.returncode != 0 or result.returncode != 0:
            raise Unavailable(f"apt-get could not install {missing}: {result.stderr[-2000:]}")


def engine_answers() -> bool:
    try:
        return subprocess.run([DOCKER, "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def start_dockerd(state: Path) -> subprocess.Popen[bytes] | None:
    """Start dockerd by hand and wait for `docker info`; None when one already answers."""
    if engine_answers():
        log("a Docker engine already answers; using it (and leaving it running)")
        return None
    state.mkdir(parents=True, exist_ok=True)
    log_path = state / "dockerd.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [DOCKERD, "--pidfile", str(state / "dockerd.pid")],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while not engine_answers():
        if process.poll() is not None or time.monotonic() > deadline:
            stop_dockerd(process)
            tail = log_path.read_text(errors="replace")[-3000:]
            raise Unavailable(f"dockerd did not start (log {log_path}):\n{tail}")
        time.sleep(0.5)
    log(f"dockerd started, pid {process.pid}, log {log_path}")
    return process


def stop_dockerd(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


# The local base: Debian minbase with python3 and python3-venv, without documentation.
MMDEBSTRAP_OPTIONS = (
    "--variant=minbase",
    "--include=python3,python3-venv,ca-certificates",
    # Without it, a bookworm minbase pulls in perl for usrmerge.
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
)


def base_key() -> tuple[str, str]:
    """(suite, a hash of the mmdebstrap options): the base's tag and tarball carry both,
    so changing the options rebuilds it."""
    key = hashlib.sha256("\n".join(MMDEBSTRAP_OPTIONS).encode()).hexdigest()[:8]
    return codename(), key


def base_tarball() -> Path:
    """The local Debian base as a tarball, cached under .cache/image/; no engine needed."""
    suite, key = base_key()
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / f"base-{suite}-{key}.tar"
    if not tarball.exists():
        for stale in CACHE.glob("base-*.tar"):
            stale.unlink()
        partial = CACHE / f"partial-{suite}-{key}.tar"
        run(["mmdebstrap", "--quiet", *MMDEBSTRAP_OPTIONS, suite, str(partial)])
        partial.rename(tarball)
    return tarball


def ensure_base() -> str:
    """The local Debian base in the engine, imported from the cached tarball."""
    suite, key = base_key()
    tag = f"inferwire-base:{suite}-{key}"
    if subprocess.run([DOCKER, "image", "inspect", tag], capture_output=True).returncode != 0:
        docker("import", str(base_tarball()), tag)
    return tag


def image_id() -> str | None:
    result = subprocess.run(
        [DOCKER, "image", "inspect", "--format", "{{.Id}}", IMAGE], capture_output=True, text=True
    )
    return result.stdout.strip() if result.returncode == 0 else None


def build_image(base: str) -> None:
    """Build IMAGE; the image it replaces, if any, is removed so rebuilds do not pile up."""
    previous = image_id()
    args = ["build", "--file", "deploy/Dockerfile", "--build-arg", f"BASE={base}", "--tag", IMAGE]
    if CA_BUNDLE.exists():  # the host's bundle, with any extra CA; a secret, never a layer
        args += ["--secret", f"id=ca,src={CA_BUNDLE}"]
    run([DOCKER, *args, "."], cwd=REPO, env={**os.environ, "DOCKER_BUILDKIT": "1"})
    if previous and previous != image_id():
        subprocess.run([DOCKER, "image", "rm", previous], capture_output=True)


def tool(*names: str) -> str:
    """The first of `names` found on PATH or in .tools/bin (scripts/install_tools.sh)."""
    for name in names:
        path = shutil.which(name) or shutil.which(name, path=str(TOOLS_BIN))
        if path:
            return path
    raise AssertionError(f"{' or '.join(names)} is not installed; run scripts/install_tools.sh")


def health_probe() -> str:
    return tool("grpc_health_probe")  # the upstream binary's name


def host_port(container: str, port: int) -> str:
    # "127.0.0.1:49153" (one line per address family)
    return docker("port", container, f"{port}/tcp").split()[0]


def running(container: str) -> bool:
    state = docker("inspect", "--format", "{{.State.Running}}", container)
    return state.strip() == "true"


def wait_container_serving(
    container: str, address: str, service: str, timeout_s: float = 90
) -> None:
    """Probe until SERVING; fail at once when the container has exited."""
    probe = health_probe()
    deadline = time.monotonic() + timeout_s
    while True:
        result = subprocess.run(
            [probe, f"-addr={address}", f"-service={service}", "-connect-timeout=2s"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if result.returncode == 0:
            answer = (result.stdout + result.stderr).strip()
            log(f"grpc_health_probe -service={service!r}: {answer}")
            return
        if not running(container):
            raise AssertionError(f"the container exited before -service={service!r} was SERVING")
        if time.monotonic() > deadline:
            raise AssertionError(
                f"grpc_health_probe -service={service!r} never SERVING: "
                f"exit {result.returncode} {result.stdout}{result.stderr}"
            )
        time.sleep(0.5)


def infer(grpc_address: str, request: Mapping[str, object]) -> dict[str, Any]:
    """One Infer through grpcurl (reflection, plaintext); the reply as JSON."""
    command = [tool("grpcurl"), "-plaintext", "-d", json.dumps(request), grpc_address]
    reply = json.loads(run([*command, "inferwire.v1.InferenceService/Infer"], timeout=120))
    assert reply["requestId"] == request["request_id"], reply
    assert reply["model"] == request["model"], reply
    assert reply.get("text"), reply
    log(f"grpcurl Infer {request['model']}: {reply['text'][:60]!r}")
    return reply


def check_infer_counted(metrics_address: str) -> None:
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    started = [
        line
        for line in metrics.splitlines()
        if line.startswith("grpc_server_started_total{") and 'grpc_method="Infer"' in line
    ]
    assert started and float(started[0].rsplit(" ", 1)[1]) >= 1, metrics[-3000:]
    log(f"/metrics: {started[0]}")


def check_http_completion(http_address: str) -> None:
    """One OpenAI Completions call on the image's HTTP port (8000)."""
    body = json.dumps({"model": "demo", "prompt": "The image", "max_tokens": 8}).encode()
    request = urllib.request.Request(
        f"http://{http_address}/v1/completions",
        data=body,
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        reply = json.loads(response.read())
    assert reply["usage"]["completion_tokens"] == 8, reply
    log(f"HTTP /v1/completions: {reply['choices'][0]['text'][:60]!r}")


def check_stored_response(http_address: str) -> None:
    """A Responses call stored (the default) on the read-only root: the image's state
    directory is its volume, so the SQLite store takes it and GET reads it back."""
    body = {"model": "demo", "input": "The image", "max_output_tokens": 8}
    request = urllib.request.Request(
        f"http://{http_address}/v1/responses",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        created = json.loads(response.read())
    assert created["store"] is True and created["output"], created
    url = f"http://{http_address}/v1/responses/{created['id']}"
    with urllib.request.urlopen(url, timeout=30) as response:
        stored = json.loads(response.read())
    assert stored["id"] == created["id"] and stored["output"] == created["output"], stored
    log(f"HTTP /v1/responses stored and read back: {created['id']}")


def probe(container: str) -> None:
    grpc_address, metrics_address = host_port(container, 50051), host_port(container, 9464)
    wait_container_serving(container, grpc_address, "")
    wait_container_serving(container, grpc_address, "model/demo")
    infer(grpc_address, {"model": "demo", "prompt": "The image", "request_id": "image-check"})
    check_infer_counted(metrics_address)
    check_http_completion(host_port(container, 8000))
    check_stored_response(host_port(container, 8000))


EXTRA_CAS = Path("/usr/local/share/ca-certificates")
# Run inside the image: which certificate files hold any of the given base64 lines.
FIND_CERTS = """
import os, sys
markers = [m.encode() for m in sys.argv[1:]]
for root, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/dev")]
    for name in files:
        path = os.path.join(root, name)
        if name.endswith((".crt", ".pem")) and os.path.isfile(path):
            data = open(path, "rb").read()
            if any(m in data for m in markers):
                print(path)
"""


def check_no_extra_ca() -> None:
    """The host's extra CAs (the proxy's) were trusted in the builder only."""
    markers = []
    for cert in sorted(EXTRA_CAS.glob("*.crt")):
        lines = [line for line in cert.read_text().splitlines() if not line.startswith("-----")]
        if len(lines) > 2:
            markers.append(lines[1])  # a line of the certificate's own body
    if not markers:
        return
    found = docker(
        *("run", "--rm", "--network", "none", "--entrypoint", "python3", IMAGE),
        *("-c", FIND_CERTS, *markers),
    ).split()
    assert not found, f"the host's extra CA certificates reached the image: {found}"
    log(f"none of the {len(markers)} extra CA certificates is in the image")


def check_quiet_grpc_core() -> None:
    """The image sets GRPC_VERBOSITY=NONE (docs/deployment.md): gRPC core's own stderr
    lines, such as a refused TLS handshake's, stay out of the JSON log."""
    env = docker("image", "inspect", "--format", "{{json .Config.Env}}", IMAGE)
    assert "GRPC_VERBOSITY=NONE" in json.loads(env), env


# Every run of the image: read-only root, no capability, no privilege gain, its own user.
LOCKED_DOWN = [
    *("--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL"),
    *("--security-opt", "no-new-privileges"),
]


@contextmanager
def locked_down_container(
    label: str, run_args: list[str], timings: dict[str, float]
) -> Iterator[str]:
    """Run IMAGE detached and locked down with `run_args`; yield its ID. On leaving, stop
    it (SIGTERM: drain) and, when the body passed, require exit code 0."""
    user = docker("image", "inspect", "--format", "{{.Config.User}}", IMAGE).strip()
    assert user and user.split(":")[0] not in ("0", "root"), f"image runs as {user!r}"
    name = f"inferwire-image-check-{label}-{os.getpid()}"
    with step(f"start the container ({label})", timings):
        container = docker(
            *("run", "--detach", "--name", name, *LOCKED_DOWN, "--user", user),
            *run_args,
            IMAGE,
        ).strip()
    try:
        try:
            yield container
        except BaseException:
            logs = subprocess.run([DOCKER, "logs", container], capture_output=True, text=True)
            log(f"container log:\n{logs.stdout[-4000:]}{logs.stderr[-4000:]}")
            raise
    finally:
        with step(f"stop the container ({label}; SIGTERM: drain)", timings):
            subprocess.run([DOCKER, "stop", "--time", "30", container], capture_output=True)
            state = subprocess.run(
                [DOCKER, "inspect", "--format", "{{.State.ExitCode}}", container],
                capture_output=True,
                text=True,
            )
            logs = subprocess.run([DOCKER, "logs", container], capture_output=True, text=True)
            log(f"exit code {state.stdout.strip()}; last log lines:")
            print(*(logs.stdout + logs.stderr).splitlines()[-3:], sep="\n", flush=True)
            subprocess.run([DOCKER, "rm", "--force", container], capture_output=True)
    # Reached only when the body passed: inferwire, PID 1 in the container, drained.
    assert state.stdout.strip() == "0", f"exit code {state.stdout.strip()} after docker stop"


def run_and_probe(timings: dict[str, float]) -> None:
    """The image as built, with its bundled demo model, on random loopback host ports."""
    ports = ["--publish", "127.0.0.1::50051", "--publish", "127.0.0.1::9464"]
    ports += ["--publish", "127.0.0.1::8000"]
    label = "probe demo: grpc_health_probe, grpcurl Infer, /metrics, HTTP /v1/completions"
    with locked_down_container("demo", ports, timings) as container, step(label, timings):
        probe(container)


def main() -> None:
    timings: dict[str, float] = {}
    with step("install docker.io and mmdebstrap (apt, when missing)", timings):
        install_packages()
    with step("start dockerd", timings):
        dockerd = start_dockerd(CACHE / "dockerd")
    try:
        with step("local Debian base (mmdebstrap, cached)", timings):
            base = ensure_base()
        with step(f"build {IMAGE} on {base}", timings):
            build_image(base)
        size = int(docker("image", "inspect", "--format", "{{.Size}}", IMAGE))
        log(f"image size: {size / 1e6:.0f} MB ({size} bytes)")
        with step("no extra CA certificate in the image", timings):
            check_no_extra_ca()
        with step("gRPC core quiet by default (GRPC_VERBOSITY=NONE)", timings):
            check_quiet_grpc_core()
        run_and_probe(timings)
        # Needs the virtualenv (inferwire's test support, tritonserver): imported here only.
        from tests.image import triton_check

        triton_check.run_and_probe(timings)
    finally:
        if dockerd is not None:
            with step("stop dockerd", timings):
                stop_dockerd(dockerd)
        log("timings: " + ", ".join(f"{name} {s:.1f} s" for name, s in timings.items()))
        log(f"total: {sum(timings.values()):.1f} s")


def prepare() -> None:
    """What needs no engine: the apt packages and the base tarball. .ci/run starts this
    early, in the background, so that the image test finds both ready."""
    timings: dict[str, float] = {}
    with step("install docker.io and mmdebstrap (apt, when missing)", timings):
        install_packages()
    with step("local Debian base tarball (mmdebstrap, cached)", timings):
        base_tarball()


if __name__ == "__main__":
    try:
        prepare() if sys.argv[1:] == ["--prepare"] else main()
    except Unavailable as error:
        print(f"SKIP: Docker unavailable: {error}", file=sys.stderr)
        sys.exit(77)
