"""Copy the packaged all-MiniLM-L6-v2 folder with its weights in fp16 (about 46 MB instead of
91 MB), for a GPU machine without network or the weights package. Use it there with
``GPUCACHE_MODEL_DIR=<folder>``. Weights are read and written with safetensors only.

    python scripts/make_fp16_model.py .model-fp16
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file

from gpucache.embedding.model import default_model_path


def main(target: str) -> None:
    source = default_model_path()
    out = Path(target)
    shutil.copytree(source, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors = {k: v.half().contiguous() for k, v in load_file(str(source / "model.safetensors")).items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    print(f"wrote {out} ({sum(f.stat().st_size for f in out.rglob('*') if f.is_file()) / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".model-fp16")
