#!/usr/bin/env bash
# Download, on a machine that reaches PyPI, every wheel scripts/gpu_check.sh installs on a
# GPU machine that reaches nothing, packed into parts small enough for one transfer each
# (where a transfer takes the working tree and the carried files together, 64 MiB at most).
#
#   scripts/gpu_wheels.sh [--dir .gpu-wheels] [--python-version 3.12] [--part-size 40M]
#
# What it fetches (Linux x86_64, CPython of --python-version; the H200 image it was written for runs 3.12):
# onnxruntime-genai-cuda 0.18 and onnxruntime-gpu (>= 1.31, a CUDA 13 build, ~256 MB),
# the transformers, tokenizers and onnx-ir versions the CPU dry run used with the model
# builder, and inferwire's own runtime dependencies (pyproject.toml, less the CPU
# onnxruntime-genai) -- with their dependencies, so the set installs on a bare Python.
# Packages the GPU image already has at a fitting version are skipped there by pip.
# torch is not fetched: the GPU image has it (the builder needs it).
#
# The wheels and a requirements.txt go into one tar split into parts (--part-size); it
# checks the set resolves offline (`pip install --dry-run --no-index` into an empty venv
# of that Python: python$PYVER, or $CHECK_PYTHON), and prints the transfers that carry the parts.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/scripts/gpu_check/transfer_parts.sh"
DIR="$ROOT/.gpu-wheels"
PYVER="3.12"
PART_SIZE="40M"  # plus the working tree (21 MiB on 4 December) under 64 MiB
# Versions the CPU dry run of scripts/gpu_check.sh was run with (docs/performance.md).
EXTRA=(onnxruntime-genai-cuda==0.18.0 "onnxruntime-gpu>=1.31" transformers==5.24.0
    tokenizers==0.23.3 onnx-ir==1.1.0)

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
while [ $# -gt 0 ]; do
    case "$1" in
        --dir) DIR="$(realpath -m "$2")"; shift 2 ;;
        --python-version) PYVER="$2"; shift 2 ;;
        --part-size) PART_SIZE="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done

mkdir -p "$DIR/download"
requirements="$DIR/download/requirements.txt"
{
    printf '%s\n' "${EXTRA[@]}"
    python3 - "$ROOT/pyproject.toml" <<'EOF'
import sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if not d.startswith("onnxruntime-genai")))
EOF
} > "$requirements"

abi="cp${PYVER/./}"
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 \
    manylinux_2_5 manylinux1 linux; do
    platforms+=(--platform "${tag}_x86_64")
done
DOWNLOAD="$DIR/download"
echo "downloading for CPython $PYVER into $DOWNLOAD"
python3 -m pip download --quiet --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --abi "$abi" --abi abi3 --abi none "${platforms[@]}" \
    -d "$DOWNLOAD" -r "$requirements"

# One archive of every wheel, split into parts that travel one per call; gpu_check.sh
# rejoins the parts (`cat`) and unpacks it.
pack_parts "$DIR" wheels "$DOWNLOAD" "$PART_SIZE"

py="${CHECK_PYTHON:-python$PYVER}"
if "$py" -c pass 2> /dev/null; then
    check="$(mktemp -d)"
    "$py" -m venv "$check/venv"
    "$check/venv/bin/pip" install --quiet --dry-run --no-index --find-links "$DOWNLOAD" \
        -r "$requirements"
    rm -rf "$check"
    echo "checked: the set resolves offline on a bare Python $PYVER"
else
    echo "$py does not run here (set CHECK_PYTHON): the offline resolution was not checked"
fi

echo "$(du -sh "$DOWNLOAD" | cut -f1) of wheels"
report_parts "$ROOT" "$DIR" wheels
echo "  then: scripts/gpu_check.sh --wheels /tmp/iw-wheels (docs/performance.md, \"On a GPU\")"
