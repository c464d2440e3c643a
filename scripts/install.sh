#!/usr/bin/env bash
# Install gpucache (editable) into the current Python, with optional extras.
#   bash scripts/install.sh            # the library and its command
#   bash scripts/install.sh test       # plus the test extras
# Where no torch is installed yet, the CPU build torch==2.13.0 is installed first:
# an unpinned torch would pull a multi-GB CUDA build onto a machine without a GPU.
# GPU users install their CUDA torch first (or use environment.yml); it is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
extras="${1:-}"
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    "$PY" -m pip install --quiet "torch==2.13.0"
fi
if [ -n "$extras" ]; then
    "$PY" -m pip install --quiet -e ".[$extras]"
else
    "$PY" -m pip install --quiet -e .
fi
