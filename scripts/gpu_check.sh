#!/usr/bin/env bash
# The GPU check of issue 26, in one run: a random-weight Llama (Llama-3.2-1B's shapes by
# default) exported with ONNX Runtime GenAI's model builder, with and without paged
# attention, measured in-process (og.Engine, og.Generator) and through `inferwire serve`
# (batching: auto), at 1 and 64 streams, and one stream against the bandwidth bound.
#
#   scripts/gpu_check.sh [--device cuda|cpu] [-p|--precision fp16|bf16|fp32]
#                        [--shape llama-1b|tiny] [--wheels DIR] [--out DIR] [--work DIR]
#                        [--python PYTHON] [--streams 1,64] [--max-tokens N] [--repeats N]
#                        [--no-paged] [--paged-only] [--server-options JSON] [--setup-only]
#                        [--smollm2 | --no-smollm2 | --smollm2-only] [--gguf FILE]
#                        [--smollm2-batchings auto,engine]
#
# Defaults: --device cuda -p fp16 --shape llama-1b --streams 1,64 --max-tokens 128
# --repeats 3 (with --device cpu: -p fp32 --max-tokens 32 --repeats 2); --out "$OUT" (the
# device tool's folder) or ./gpu-check-out; --work /tmp/inferwire-gpu-check. The
# paged-attention export (use_paged_attention=true, num_blocks pinned) is built only for
# cuda with fp16 or bf16, as the builder requires.
# --wheels DIR: wheels from scripts/gpu_wheels.sh (parts `NAME.part-aa`... are rejoined with
# cat; a rejoined .tar is unpacked), installed with `pip install --no-index --find-links`
# into a venv that sees the system's packages (torch, transformers, onnx); --setup-only
# stops after that and the versions line.
# --paged-only: the paged export alone (an A/B of the engine path); --server-options JSON:
# more options for the served model, e.g. '{"engine_process": true}'.
# Real weights (issue 61; on by default with --device cuda, --smollm2 on the CPU): SmolLM2-135M-
# Instruct imported from its GGUF for the device (`inferwire models import --execution cuda
# --precision fp16`; on the CPU fp32), in the background while the exports run, then served
# once per --smollm2-batchings entry (default cuda: auto,engine; cpu: auto): the 10 greedy
# prompts at 1 stream against the CPU fp32 import's text (scripts/gpu_check/
# smollm2_reference.json) and at 64 streams against the 1-stream text
# (scripts/gpu_check/smollm2.py). The GGUF and the gguf wheel travel as
# scripts/gpu_check/smollm2_parts.sh's parts beside the wheels' (or --gguf FILE); without
# them the step says so and the check goes on. --smollm2-only: that step alone.
# CPU dry run: scripts/gpu_check.sh --device cpu --shape tiny -p fp32 --python .venv-gpucheck/bin/python
# Writes results.json, summary.md and gpu_check.log to --out (docs/performance.md).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEVICE=cuda
PRECISION=
SHAPE=llama-1b
WHEELS=
OUT_DIR="${OUT:-$PWD/gpu-check-out}"
WORK=/tmp/inferwire-gpu-check
PY="${PYTHON:-python3}"
STREAMS=1,64
MAX_TOKENS=
REPEATS=
PAGED=1
SETUP_ONLY=0
PLAIN=1
SERVER_OPTIONS='{}'
SMOLLM2=
SMOLLM2_ONLY=0
GGUF=
SMOLLM2_BATCHINGS=

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
while [ $# -gt 0 ]; do
    case "$1" in
        --device) DEVICE="$2"; shift 2 ;;
        -p|--precision) PRECISION="$2"; shift 2 ;;
        --shape) SHAPE="$2"; shift 2 ;;
        --wheels) WHEELS="$(realpath "$2")"; shift 2 ;;
        --out) OUT_DIR="$2"; shift 2 ;;
        --work) WORK="$2"; shift 2 ;;
        --python) PY="$2"; shift 2 ;;
        --streams) STREAMS="$2"; shift 2 ;;
        --max-tokens) MAX_TOKENS="$2"; shift 2 ;;
        --repeats) REPEATS="$2"; shift 2 ;;
        --no-paged) PAGED=0; shift ;;
        --paged-only) PLAIN=0; shift ;;
        --server-options) SERVER_OPTIONS="$2"; shift 2 ;;
        --setup-only) SETUP_ONLY=1; shift ;;
        --smollm2) SMOLLM2=1; shift ;;
        --no-smollm2) SMOLLM2=0; shift ;;
        --smollm2-only) SMOLLM2=1; SMOLLM2_ONLY=1; shift ;;
        --gguf) GGUF="$(realpath "$2")"; shift 2 ;;
        --smollm2-batchings) SMOLLM2_BATCHINGS="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
case "$DEVICE" in cpu|cuda) ;; *) echo "--device: cpu or cuda" >&2; exit 2 ;; esac
case "$SHAPE" in tiny|llama-1b) ;; *) echo "--shape: tiny or llama-1b" >&2; exit 2 ;; esac
PRECISION="${PRECISION:-$([ "$DEVICE" = cuda ] && echo fp16 || echo fp32)}"
# A CPU run checks the plumbing: fewer tokens and batches keep it to a few minutes.
MAX_TOKENS="${MAX_TOKENS:-$([ "$DEVICE" = cuda ] && echo 128 || echo 32)}"
REPEATS="${REPEATS:-$([ "$DEVICE" = cuda ] && echo 3 || echo 2)}"
if [ "$DEVICE" = cpu ] || [ "$PRECISION" = fp32 ]; then PAGED=0; fi
SMOLLM2="${SMOLLM2:-$([ "$DEVICE" = cuda ] && echo 1 || echo 0)}"
# `batching: auto` on the CPU is the continuous path, which a GPU never takes (and which
# refuses the random model's synthetic tokenizer: llguidance's "vocab size too small;
# 128256 vs 128257"): a CPU dry run serves the plain export as CUDA's auto does, one
# og.Generator per request, unless --server-options names a batching.
if [ "$DEVICE" = cpu ] && ! grep -q '"batching"' <<< "$SERVER_OPTIONS"; then
    SERVER_OPTIONS="$("$PY" -c 'import json, sys
print(json.dumps({**json.loads(sys.argv[1]), "batching": "per_request"}))' "$SERVER_OPTIONS")"
fi

mkdir -p "$OUT_DIR" "$WORK"
OUT_DIR="$(realpath "$OUT_DIR")"
WORK="$(realpath "$WORK")"
LOG="$OUT_DIR/gpu_check.log"
: > "$LOG"
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }
# Heavy CPU steps run niced: on a shared machine they should not starve others.
NICE=(nice -n 10)

install_wheels() {
    local staged="$WORK/wheels" venv="$WORK/venv" first base
    rm -rf "$staged"
    mkdir -p "$staged"
    cp "$WHEELS"/*.whl "$staged"/ 2>/dev/null || true
    for first in "$WHEELS"/*.part-aa; do
        [ -e "$first" ] || continue
        base="$(basename "${first%.part-aa}")"
        cat "${first%.part-aa}".part-* > "$staged/$base"
        say "rejoined $base ($(ls "${first%.part-aa}".part-* | wc -l) parts)"
    done
    for archive in "$staged"/*.tar; do
        if [ -e "$archive" ]; then tar -C "$staged" -xf "$archive" && rm "$archive"; fi
    done
    "$PY" -m venv --system-site-packages "$venv"
    # The image's python3 is itself a venv (/opt/torch/.venv): --system-site-packages reaches
    # the interpreter's packages, not that venv's torch. A .pth puts $PY's own site-packages
    # after the new venv's, so the wheels installed here still come first.
    local venv_site
    venv_site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$PY" -c 'import site; print("\n".join(site.getsitepackages()))' > "$venv_site/_image_site.pth"
    local requirements=("$staged/requirements.txt")
    [ -e "${requirements[0]}" ] || { echo "no requirements.txt among the wheels" >&2; exit 1; }
    "$venv/bin/python" -m pip install --quiet --no-index --no-cache-dir --find-links "$staged" \
        -r "${requirements[0]}" 2>&1 | tee -a "$LOG"
    # The importer's GGUF reader, from scripts/gpu_check/smollm2_parts.sh's parts (its
    # other needs are in the set above; requests serves only its downloads).
    for wheel in "$staged"/gguf-*.whl; do
        [ -e "$wheel" ] || continue
        "$venv/bin/python" -m pip install --quiet --no-index --no-deps --no-cache-dir "$wheel" \
            2>&1 | tee -a "$LOG"
    done
    PY="$venv/bin/python"
}

# The CUDA libraries of the image's Python packages (nvidia-*), for ONNX Runtime's CUDA EP.
cuda_library_path() {
    "$PY" - <<'EOF'
import glob, os, site, sys
roots = [*site.getsitepackages(), site.getusersitepackages()] + sys.path
dirs = []
for root in roots:
    for pattern in ("nvidia/*/lib", "nvidia/cu*/lib"):
        for d in sorted(glob.glob(os.path.join(root, pattern))):
            if d not in dirs:
                dirs.append(d)
print(":".join(dirs))
EOF
}

timings="$WORK/timings.txt"
: > "$timings"
record() { echo "$1 $2" >> "$timings"; }  # NAME SECONDS (one short append: safe from two jobs)

started=$(date +%s)
if [ -n "$WHEELS" ]; then
    say "installing wheels from $WHEELS"
    t=$(date +%s); install_wheels; record install_wheels $(( $(date +%s) - t ))
fi
export PYTHONPATH="$ROOT:$ROOT/server${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
if [ "$DEVICE" = cuda ]; then
    libs="$(cuda_library_path)"
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
        --format=csv,noheader | tee -a "$LOG"
fi
DEVICE="$DEVICE" "$PY" - <<'EOF' 2>&1 | tee -a "$LOG"
import importlib.metadata as m
import os
import onnxruntime_genai as og
names = ["torch", "transformers", "tokenizers", "onnx", "onnx-ir", "onnxruntime",
         "onnxruntime-gpu", "onnxruntime-genai", "onnxruntime-genai-cuda", "grpcio", "protobuf"]
found = {}
for name in names:
    try:
        found[name] = m.version(name)
    except m.PackageNotFoundError:
        pass
print("versions:", found, "| genai sees CUDA:", og.is_cuda_available())
if os.environ["DEVICE"] == "cuda" and not og.is_cuda_available():
    raise SystemExit("--device cuda, but onnxruntime-genai has no CUDA: use --wheels")
EOF

[ "$SETUP_ONLY" = 1 ] && exit 0

# SmolLM2 (scripts/gpu_check/smollm2.py): its import runs beside the exports (CPU work:
# dequantizing, the builder; then one load on the device), its serving on its own.
smollm2_args=(--device "$DEVICE" --work "$WORK")
[ -n "$GGUF" ] && smollm2_args+=(--gguf "$GGUF")
smollm2_pid=
if [ "$SMOLLM2" = 1 ]; then
    say "importing SmolLM2-135M-Instruct for $DEVICE (beside the rest)"
    rm -f "$WORK/smollm2-import.json" "$OUT_DIR/smollm2.json"
    (
        t0=$(date +%s) rc=0
        "${NICE[@]}" "$PY" -m scripts.gpu_check.smollm2 import "${smollm2_args[@]}" \
            > "$WORK/smollm2-import.out" 2>&1 || rc=$?
        record import_smollm2 $(( $(date +%s) - t0 ))
        exit "$rc"
    ) &
    smollm2_pid=$!
fi
# smollm2_step [--alone]: serve the import and compare its text; a failure is said, not fatal.
smollm2_step() {
    [ "$SMOLLM2" = 1 ] || return 0
    wait "$smollm2_pid" || say "the SmolLM2 import step failed (its reason follows)"
    { echo "== SmolLM2 import"; cat "$WORK/smollm2-import.out"; } >> "$LOG"
    local run_args=("${smollm2_args[@]}" --out "$OUT_DIR" "$@") t0
    [ -n "$SMOLLM2_BATCHINGS" ] && run_args+=(--batchings "$SMOLLM2_BATCHINGS")
    say "SmolLM2: greedy text at 1 and 64 streams against the CPU fp32 import's"
    t0=$(date +%s)
    if ! timeout 420 "${NICE[@]}" "$PY" -m scripts.gpu_check.smollm2 run "${run_args[@]}" 2>&1 \
        | tee -a "$LOG"; then
        say "the SmolLM2 step failed; what it measured is in $OUT_DIR/smollm2.json"
    fi
    record smollm2 $(( $(date +%s) - t0 ))
}
if [ "$SMOLLM2_ONLY" = 1 ]; then
    smollm2_step --alone
    say "done in $(( $(date +%s) - started )) s: $OUT_DIR/results.json, $OUT_DIR/summary.md"
    exit 0
fi

HF="$WORK/hf-$SHAPE"
say "building a random $SHAPE model (Hugging Face format) in $HF"
t=$(date +%s)
rm -rf "$HF"
"${NICE[@]}" "$PY" -m scripts.gpu_check.model --shape "$SHAPE" --out "$HF" >> "$LOG" 2>&1
record build_hf $(( $(date +%s) - t ))

# export_model NAME EXTRA_OPTIONS...: one export; both run at once on a GPU host (16 cores).
export_model() {
    local name="$1"; shift
    local dir="$WORK/onnx-$SHAPE-$PRECISION-$name" t0
    t0=$(date +%s)
    rm -rf "$dir"
    "${NICE[@]}" "$PY" -m onnxruntime_genai.models.builder -i "$HF" -o "$dir" -p "$PRECISION" \
        -e "$DEVICE" -c "$WORK/cache-$name" "$@" > "$WORK/builder-$name.log" 2>&1
    record "export_$name" $(( $(date +%s) - t0 ))
}
variants=()
say "exporting with the model builder: -p $PRECISION -e $DEVICE"
t=$(date +%s)
pids=()
if [ "$PLAIN" = 1 ]; then
    export_model plain &
    pids+=($!)
fi
if [ "$PAGED" = 1 ]; then
    # 512 blocks of 256 tokens: 64 streams of a short prompt plus 256 tokens fit many
    # times over, and the cache is sized the same on every GPU (not a share of free memory).
    export_model paged --extra_options use_paged_attention=true num_blocks=512 &
    pids+=($!)
    variants+=("paged=$WORK/onnx-$SHAPE-$PRECISION-paged")
fi
# The paged export first: were the per-request path at 64 streams (the plain export) to
# run past a time limit, the engine path's figures would already be written.
if [ "$PLAIN" = 1 ]; then variants+=("plain=$WORK/onnx-$SHAPE-$PRECISION-plain"); fi
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
record export_all $(( $(date +%s) - t ))
for log in "$WORK"/builder-*.log; do
    { echo "== $log (last lines)"; tail -n 15 "$log"; } >> "$LOG"
done
# Before the speed figures (and whether or not an export failed): its minute or two stays
# clear of a limit that the per-request path at 64 streams, measured last, could reach.
smollm2_step
if [ "$failed" = 1 ]; then
    say "an export failed; see $LOG"
    exit 1
fi

say "measuring: streams $STREAMS, $MAX_TOKENS tokens, $REPEATS batches each"
args=()
for v in "${variants[@]}"; do args+=(--variant "$v"); done
"${NICE[@]}" "$PY" -m scripts.gpu_check.measure "${args[@]}" --device "$DEVICE" --shape "$SHAPE" \
    --precision "$PRECISION" --streams "$STREAMS" --max-tokens "$MAX_TOKENS" \
    --repeats "$REPEATS" --timings "$timings" --server-options "$SERVER_OPTIONS" \
    --smollm2 "$OUT_DIR/smollm2.json" --out "$OUT_DIR" 2>&1 | tee -a "$LOG"
say "done in $(( $(date +%s) - started )) s: $OUT_DIR/results.json, $OUT_DIR/summary.md"
