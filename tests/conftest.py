"""Shared fixtures: the devices to run on, a fast deterministic embedder, and the real model."""

from __future__ import annotations

import os

# As an application would, before anything loads numpy: quiet numpy's BLAS thread pool
# (gpucache/index/blas_pool.py), so the tests run the paths the command runs.
import gpucache

gpucache.quiet_blas_pool()

# isort: split
import torch  # noqa: E402

# Triton kernels run on a CPU machine through Triton's interpreter; the variable must be set
# before triton decorates the kernels (at import of gpucache.kernels).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import hashlib  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402

import pytest  # noqa: E402

from gpucache import TransformerEmbedder  # noqa: E402
from gpucache.guard.lexical import clear_caches  # noqa: E402

# The exams (data/exam/) are read by their report alone (bench/guard_exam.py) and by the exam's
# own checks (tests/guard/test_exam.py, which sets ``exam_reads_allowed``): any other open of a
# file there during the tests, by whatever path it was built from, is refused at the open
# itself (an audit hook: every open in this process passes through it).
EXAM_FOLDER = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", "data", "exam")) + os.sep
exam_reads_allowed = False


def _refuse_exam_reads(event: str, args: tuple) -> None:  # type: ignore[type-arg]
    if event != "open" or exam_reads_allowed or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    path = os.fsdecode(args[0])
    if os.path.realpath(path).startswith(EXAM_FOLDER):  # links and ".." resolved
        raise PermissionError(f"{path}: the exams are read by their report alone (tests/guard/test_exam.py)")


sys.addaudithook(_refuse_exam_reads)


@pytest.fixture(autouse=True)
def _guard_reads_afresh() -> None:
    """Each test reads its prompts afresh: the guard memoises every prompt and word it has read,
    and a verdict served from an earlier test's memo never runs the rules this test names (a
    mutation run, which forks each mutant's tests from a process that has read them all,
    otherwise counts a broken parser as tested)."""
    clear_caches()


_DEVICES = [pytest.param("cpu", id="cpu")]
if torch.cuda.is_available():
    _DEVICES.append(pytest.param("cuda", id="cuda", marks=pytest.mark.gpu))


@pytest.fixture(params=_DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    """``cpu`` always, and ``cuda`` (marked ``gpu``) where a GPU is present."""
    return torch.device(request.param)


class FakeEmbedder:
    """Bag-of-words embedder for fast tests of the cache logic, not of meaning.

    Each lowercased word maps to a fixed pseudo-random unit vector (seeded by blake2b, so it is
    the same in every process); a text is the normalised sum. Texts with the same words embed
    identically; sharing most words gives a high similarity; disjoint words give about 0.
    ``calls`` counts ``encode`` calls and ``texts`` records what was embedded.
    """

    name = "fake-bag-of-words"

    def __init__(self, dim: int = 64, device: str | torch.device = "cpu") -> None:
        self._dim = dim
        self._device = torch.device(device)
        self.calls = 0
        self.texts: list[str] = []
        self.fail_with: BaseException | None = None

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def device(self) -> torch.device:
        return self._device

    def _word(self, word: str) -> torch.Tensor:
        seed = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
        gen = torch.Generator().manual_seed(seed % 2**63)
        return torch.randn(self._dim, generator=gen)

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        if self.fail_with is not None:
            raise self.fail_with
        self.calls += 1
        self.texts.extend(texts)
        out = torch.zeros((len(texts), self._dim))
        for i, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()) or [text]:
                out[i] += self._word(word)
        return torch.nn.functional.normalize(out, dim=1).to(self._device)


@pytest.fixture
def fake_embedder() -> FakeEmbedder:
    return FakeEmbedder()


@pytest.fixture(scope="session")
def real_embedder() -> TransformerEmbedder:
    """The packaged all-MiniLM-L6-v2 on the CPU, loaded once per test session."""
    return TransformerEmbedder(device="cpu")


def outputs_under_hash_seeds(code: str, stdin: str = "", seeds=("0", "1", "12345")) -> set[str]:
    """What ``python -c code`` prints under each PYTHONHASHSEED: one element when the code's
    output does not depend on Python's per-process string hashing."""
    outputs = set()
    for seed in seeds:
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.pathsep.join(sys.path)}
        out = subprocess.run(
            [sys.executable, "-c", code], input=stdin, capture_output=True, text=True, env=env, timeout=300
        )
        assert out.returncode == 0, out.stderr
        outputs.add(out.stdout)
    return outputs
