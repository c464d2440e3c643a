#!/usr/bin/env bash
# One prepared run for a machine with a CUDA GPU: the GPU tests and the GPU-vs-CPU benchmark,
# results under ${OUT:-gpu-results}/. Expects torch (CUDA), transformers, triton and nvidia-ml-py
# installed, and the model folder made by scripts/make_fp16_model.py in .model-fp16.
#   bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-results}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 GPUCACHE_MODEL_DIR="${GPUCACHE_MODEL_DIR:-$PWD/.model-fp16}"
python3 -m pip install --quiet --no-deps -e . 2>&1 | tail -2
python3 -m gpucache info 2>&1 | tee "$out/info.txt"
python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$out/pytest-gpu.txt"
python3 -m gpucache bench --out "$out/bench.md" 2>&1 | tail -40
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
