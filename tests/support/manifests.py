"""Rendered Kubernetes manifests (deploy/kubernetes, deploy/gateway) and what the inferwire
pods in them read: kustomize builds with the real `kustomize`, and the configuration in
the mounted ConfigMap is loaded by inferwire's own load_settings."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwire.config import Settings, load_settings
from tests.support.polyglot import REPO, require_tool

DEPLOY = REPO / "deploy"
KUBERNETES_VERSION = "1.32.0"  # the oldest Kubernetes the manifests are checked against

Objects = list[dict[str, Any]]


def without_inferwire_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pod sets no INFERWIRE_* variable beyond INFERWIRE_CONFIG; the test run's must not
    leak into the settings read from a ConfigMap (conftest sets some for its servers)."""
    for name in [n for n in os.environ if n.startswith("INFERWIRE_")]:
        monkeypatch.delenv(name)


def render(kustomization: Path) -> Objects:
    result = subprocess.run(
        [require_tool("kustomize"), "build", str(kustomization)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def one(objects: Objects, kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def inferwire_container(objects: Objects) -> dict[str, Any]:
    pod = one(objects, "Deployment", "inferwire")["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "inferwire"]
    return container


def mounted_settings(objects: Objects, tmp_path: Path) -> Settings:
    """The configuration file the container reads, loaded as `inferwire serve` would."""
    container = inferwire_container(objects)
    config_path = Path(
        next(e["value"] for e in container["env"] if e["name"] == "INFERWIRE_CONFIG")
    )
    volume = volume_at(objects, config_path)
    config_map = one(objects, "ConfigMap", volume["configMap"]["name"])
    file = tmp_path / config_path.name
    file.write_text(config_map["data"][config_path.name])
    return load_settings(file)


def volume_at(objects: Objects, path: Path) -> dict[str, Any]:
    """The pod volume mounted at the directory that holds `path` (a whole-directory mount)."""
    pod = one(objects, "Deployment", "inferwire")["spec"]["template"]["spec"]
    mounts = [
        m
        for m in inferwire_container(objects)["volumeMounts"]
        if Path(m["mountPath"]) == path.parent
    ]
    assert len(mounts) == 1, f"{path}: no volume is mounted at {path.parent}"
    assert "subPath" not in mounts[0], "a subPath mount never sees a rotated Secret"
    (volume,) = [v for v in pod["volumes"] if v["name"] == mounts[0]["name"]]
    return volume


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])
