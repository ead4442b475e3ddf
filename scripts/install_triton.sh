#!/usr/bin/env bash
# Installs what the Triton backend and its integration tests (tests/triton/) need:
#   - inferwire's `triton` extra (tritonclient) into the Python environment;
#   - nvidia-pytriton, only for the real `tritonserver` binary and Python backend that
#     the tests launch. --no-deps: the wheel pins numpy<2, and its own Python binding
#     (which needs those pins) is not used;
#   - the Debian packages the Python backend stub needs: it embeds the system Python
#     (libpython3.11) in isolated mode, and triton_python_backend_utils imports numpy
#     (python3-numpy). Needs root or sudo when they are missing;
#   - the stub for that system Python, copied where the Python backend looks for it.
#
# Usage: scripts/install_triton.sh [path/to/venv/python]     (default: .venv/bin/python)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${1:-.venv/bin/python}

"$PYTHON" -m pip install --quiet -e ".[triton]"
"$PYTHON" -m pip install --quiet --no-deps "nvidia-pytriton==0.7.0"

missing=()
ldconfig -p | grep -q "libpython3.11.so.1.0" || missing+=(libpython3.11)
/usr/bin/python3 -c "import numpy" 2>/dev/null || missing+=(python3-numpy)
if ((${#missing[@]})); then
    SUDO=$([[ $(id -u) == 0 ]] && echo "" || echo sudo)
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq "${missing[@]}"
fi

SYSTEM_PY=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
TRITON_DIR=$("$PYTHON" -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("pytriton").origin).parent / "tritonserver")')
STUB="$TRITON_DIR/python_backend_stubs/$SYSTEM_PY/triton_python_backend_stub"
if [[ ! -x "$STUB" ]]; then
    echo "no Python backend stub for the system Python $SYSTEM_PY in $TRITON_DIR" >&2
    exit 1
fi
TARGET="$TRITON_DIR/backends/python/triton_python_backend_stub"
if ! cmp -s "$STUB" "$TARGET"; then
    cp "$STUB" "$TARGET.tmp" && mv "$TARGET.tmp" "$TARGET"  # mv: safe while a server runs
fi
echo "tritonserver: $TRITON_DIR/bin/tritonserver"
