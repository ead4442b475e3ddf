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
for log in "$WORK"/builder-*.log; do
    { echo "== $log (last lines)"; tail -n 15 "$log"; } >> "$LOG"
done
if [ "$failed" = 1 ]; then
    say "an export failed; see $LOG"
    exit 1
fi
record export_all $(( $(date +%s) - t ))

say "measuring: streams $STREAMS, $MAX_TOKENS tokens, $REPEATS batches each"
args=()
for v in "${variants[@]}"; do args+=(--variant "$v"); done
"${NICE[@]}" "$PY" -m scripts.gpu_check.measure "${args[@]}" --device "$DEVICE" --shape "$SHAPE" \
    --precision "$PRECISION" --streams "$STREAMS" --max-tokens "$MAX_TOKENS" \
    --repeats "$REPEATS" --timings "$timings" --server-options "$SERVER_OPTIONS" \
    --out "$OUT_DIR" 2>&1 | tee -a "$LOG"
say "done in $(( $(date +%s) - started )) s: $OUT_DIR/results.json, $OUT_DIR/summary.md"
