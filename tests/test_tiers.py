"""The package's three tiers (docs/architecture.md, "Tiers"), held by importing it with what a
user may not have installed taken away.

- *values* import the standard library alone: settings, keys, typed answers and outcomes,
  tenancy and keying, the guard, the policies, and what must load before the engine (the
  package's root, the command's parser);
- the *engine* imports the core dependencies too (torch, numpy, transformers, safetensors);
- each *extra* imports its own libraries, and where they are missing says which extra to
  install (``gpucache.extras.MissingExtra``), never a bare ``No module named ...``.

Why in subprocesses: a library is taken away by ``sys.modules[name] = None`` before anything
imports it, which only a fresh interpreter guarantees. Every module of the package is in
``TIERS``: a new module is placed there, or this file fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpucache.extras import EXTRAS

PACKAGE = Path(__file__).resolve().parents[1] / "gpucache"

# What the engine needs beyond the standard library: the core dependencies and their own
ENGINE_LIBRARIES = (
    "torch",
    "numpy",
    "transformers",
    "safetensors",
    "tokenizers",
    "pynvml",
    "tqdm",
    "spellchecker",
    "tomli",
)
EXTRA_LIBRARIES = tuple(sorted({name for names in EXTRAS.values() for name in names}))

VALUES = "values"
ENGINE = "engine"

TIERS: dict[str, str] = {
    "gpucache": VALUES,
    "gpucache.calibrate": VALUES,
    "gpucache.cli": VALUES,
    "gpucache.extras": VALUES,
    "gpucache.fields": VALUES,
    "gpucache.keys": VALUES,
    "gpucache.telemetry": VALUES,
    "gpucache.devices": ENGINE,
    "gpucache.pairing": VALUES,
    "gpucache.pairing.meta": VALUES,
    "gpucache.pairing.model": ENGINE,
    "gpucache.pairing.training": VALUES,
    "gpucache.pairing.training.edits": VALUES,
    "gpucache.pairing.training.fit": ENGINE,
    "gpucache.pairing.training.halves": VALUES,
    "gpucache.pairing.training.pairs": VALUES,
    "gpucache.benchmark": VALUES,
    "gpucache.benchmark.embedding": ENGINE,
    "gpucache.benchmark.lookups": ENGINE,
    "gpucache.benchmark.machine": ENGINE,
    "gpucache.benchmark.report": ENGINE,
    "gpucache.benchmark.runner": ENGINE,
    "gpucache.benchmark.scan": ENGINE,
    "gpucache.benchmark.sizing": ENGINE,
    "gpucache.benchmark.timing": ENGINE,
    "gpucache.cache": VALUES,
    "gpucache.cache.served": VALUES,
    "gpucache.cache.settings": VALUES,
    "gpucache.cache.stats": VALUES,
    "gpucache.cache.validation": VALUES,
    "gpucache.cache.flight": VALUES,
    "gpucache.cache.batching": ENGINE,
    "gpucache.cache.claims": ENGINE,
    "gpucache.cache.core": ENGINE,
    "gpucache.cache.drivers": ENGINE,
    "gpucache.cache.entries": ENGINE,
    "gpucache.cache.flow": ENGINE,
    "gpucache.cache.loading": ENGINE,
    "gpucache.cache.lookup": ENGINE,
    "gpucache.cache.onloop": ENGINE,
    "gpucache.cache.replication": ENGINE,
    "gpucache.cache.replicated": ENGINE,
    "gpucache.cache.upkeep": ENGINE,
    "gpucache.cache.saving": ENGINE,
    "gpucache.cache.semantic": ENGINE,
    "gpucache.cache.snapshot": ENGINE,
    "gpucache.conversation": VALUES,
    "gpucache.conversation.context": VALUES,
    "gpucache.conversation.value": VALUES,
    "gpucache.demo": VALUES,
    "gpucache.demo.local_model": ENGINE,
    "gpucache.demo.replay": ENGINE,
    "gpucache.embedding": VALUES,
    "gpucache.embedding.settings": VALUES,
    "gpucache.embedding.choose": VALUES,
    "gpucache.embedding.attention": ENGINE,
    "gpucache.embedding.embedder": ENGINE,
    "gpucache.embedding.graphs": ENGINE,
    "gpucache.embedding.lean": ENGINE,
    "gpucache.embedding.model": ENGINE,
    "gpucache.guard": VALUES,
    "gpucache.guard.calibration": VALUES,
    "gpucache.guard.differences": VALUES,
    "gpucache.guard.features": VALUES,
    "gpucache.guard.learned": VALUES,
    "gpucache.guard.lexical": VALUES,
    "gpucache.guard.memo": VALUES,
    "gpucache.guard.pair": VALUES,
    "gpucache.guard.parsing": VALUES,
    "gpucache.guard.payload": VALUES,
    "gpucache.guard.quantities": VALUES,
    "gpucache.guard.request": VALUES,
    "gpucache.guard.roles": VALUES,
    "gpucache.guard.settings": VALUES,
    "gpucache.guard.shapes": VALUES,
    "gpucache.guard.verifier": VALUES,
    "gpucache.guard.words": VALUES,
    "gpucache.index": VALUES,
    "gpucache.index.blas_pool": VALUES,  # must load before numpy does
    "gpucache.index.interface": VALUES,
    "gpucache.index.codecs": ENGINE,
    "gpucache.index.fallback": ENGINE,
    "gpucache.index.kernel_choice": ENGINE,
    "gpucache.index.probes": ENGINE,
    "gpucache.index.measure": ENGINE,
    "gpucache.index.paths": ENGINE,
    "gpucache.index.refine": ENGINE,
    "gpucache.index.rows": ENGINE,
    "gpucache.index.scratch": ENGINE,
    "gpucache.index.store": ENGINE,
    "gpucache.index.topk": ENGINE,
    "gpucache.index.engines": VALUES,
    "gpucache.index.engines.base": ENGINE,
    "gpucache.index.engines.choose": ENGINE,
    "gpucache.index.engines.int8_cpu": ENGINE,
    "gpucache.index.engines.numpy_engine": ENGINE,
    "gpucache.index.engines.torch_engine": ENGINE,
    "gpucache.index.engines.triton_engine": ENGINE,  # Triton where installed, the reference else
    "gpucache.kernels": ENGINE,
    "gpucache.kernels.scan_topk": ENGINE,
    "gpucache.integrations": VALUES,
    "gpucache.integrations.langchain": "langchain",
    "gpucache.policy": VALUES,
    "gpucache.policy.admission": VALUES,
    "gpucache.policy.content": VALUES,
    "gpucache.serve": VALUES,
    "gpucache.serve.exchange": VALUES,
    "gpucache.serve.heap": VALUES,
    "gpucache.serve.keyfile": VALUES,
    "gpucache.serve.keying": VALUES,
    "gpucache.serve.passthrough": VALUES,
    "gpucache.serve.rates": VALUES,
    "gpucache.serve.settings": VALUES,
    "gpucache.serve.slots": VALUES,
    "gpucache.serve.sources": VALUES,
    "gpucache.serve.tenancy": VALUES,
    "gpucache.serve.lifecycle": ENGINE,  # builds the cache; no library of the extra
    "gpucache.serve.admin": "serve",
    "gpucache.serve.answers": "serve",
    "gpucache.serve.app": "serve",
    "gpucache.serve.auth": "serve",
    "gpucache.serve.connections": "serve",
    "gpucache.serve.intake": "serve",
    "gpucache.serve.metrics": "serve",
    "gpucache.serve.proxy": "serve",
    "gpucache.serve.streams": "serve",
    "gpucache.serve.upstream": "serve",
    "gpucache.serve.wire": "serve",
    "gpucache.share": VALUES,
    "gpucache.share.replay": VALUES,
    "gpucache.share.settings": VALUES,
    "gpucache.share.records": ENGINE,
    "gpucache.share.link": "share",
    "gpucache.share.redis": "share",
    "gpucache.share.tail": "share",
    "gpucache.share.writer": "share",
}


def _tier(*tiers: str) -> list[str]:
    return sorted(name for name, tier in TIERS.items() if tier in tiers)


# Imports ``modules`` one by one with ``blocked`` taken away and prints, as JSON, each one's
# outcome ("ok", or the exception's type, its extra where it has one, and its message) and
# which of ``watched`` were loaded in the end
_PROBE = textwrap.dedent("""
    import importlib, json, sys
    blocked, modules, watched = json.loads(sys.argv[1])
    for name in blocked:
        sys.modules[name] = None
    outcomes = {}
    for module in modules:
        try:
            importlib.import_module(module)
            outcomes[module] = ["ok", None, ""]
        except BaseException as exc:
            outcomes[module] = [type(exc).__name__, getattr(exc, "extra", None), str(exc)]
    loaded = sorted(n for n in watched if sys.modules.get(n) is not None)
    print(json.dumps({"outcomes": outcomes, "loaded": loaded}))
""")


def probe(
    modules: list[str], blocked: tuple[str, ...] = (), watched: tuple[str, ...] = ()
) -> tuple[dict[str, list], list[str]]:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps([list(blocked), modules, list(watched)])],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=PACKAGE.parent,
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout.splitlines()[-1])
    return doc["outcomes"], doc["loaded"]


def _failed(outcomes: dict[str, list]) -> dict[str, list]:
    return {module: outcome for module, outcome in outcomes.items() if outcome[0] != "ok"}


def _package_modules() -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    found.discard("gpucache.__main__")  # runs the command
    found.discard("gpucache.pairing.training.__main__")  # runs the training
    return found


def test_every_module_of_the_package_has_a_tier():
    assert _package_modules() == set(TIERS)


def test_the_extras_name_only_their_own_libraries():
    for extra, libraries in EXTRAS.items():
        assert not set(libraries) & set(ENGINE_LIBRARIES), extra
        for other, theirs in EXTRAS.items():
            assert other == extra or not set(libraries) & set(theirs), (extra, other)


def test_value_modules_import_with_nothing_installed_but_the_standard_library():
    outcomes, _ = probe(_tier(VALUES), blocked=ENGINE_LIBRARIES + EXTRA_LIBRARIES)
    assert _failed(outcomes) == {}


def test_value_modules_load_neither_the_engine_nor_any_extra_where_all_are_installed():
    """A value module that imports torch or starlette only when they are there (a ``try``) is
    still one that pays for them: with everything installed, none is loaded."""
    outcomes, loaded = probe(_tier(VALUES), watched=ENGINE_LIBRARIES + EXTRA_LIBRARIES)
    assert _failed(outcomes) == {}
    assert loaded == []


def test_the_settings_trees_load_neither_torch_nor_starlette():
    settings = [
        "gpucache.cache.settings",
        "gpucache.serve.settings",
        "gpucache.serve.sources",
        "gpucache.embedding.settings",
        "gpucache.guard.settings",
        "gpucache.share.settings",
    ]
    outcomes, loaded = probe(settings, watched=("torch", "numpy", "starlette", "httpx", "redis"))
    assert _failed(outcomes) == {} and loaded == []


def test_engine_modules_import_with_no_extra_installed():
    outcomes, loaded = probe(_tier(VALUES, ENGINE), blocked=EXTRA_LIBRARIES, watched=("torch",))
    assert _failed(outcomes) == {}
    assert loaded == ["torch"]  # the probe did reach the engine


@pytest.mark.parametrize("extra", sorted(set(EXTRAS) & set(TIERS.values())))
def test_an_extras_modules_import_with_it_and_without_the_other_extras(extra):
    others = tuple(name for other, names in EXTRAS.items() if other != extra for name in names)
    outcomes, _ = probe(_tier(extra), blocked=others)
    assert _failed(outcomes) == {}


@pytest.mark.parametrize("extra", sorted(set(EXTRAS) & set(TIERS.values())))
def test_without_its_extra_a_module_says_which_extra_to_install(extra):
    outcomes, _ = probe(_tier(extra), blocked=EXTRAS[extra])
    failed = _failed(outcomes)
    assert failed, f"no module of the {extra} extra needs it"
    for module, (kind, named, message) in failed.items():
        assert (kind, named) == ("MissingExtra", extra), (module, kind, message)
        assert f"pip install 'gpucache[{extra}]'" in message


def test_the_blocking_itself_is_seen():
    """The probe's own check: a module that needs a blocked library fails to import."""
    outcomes, _ = probe(["gpucache.index.store"], blocked=("torch",))
    assert outcomes["gpucache.index.store"][0] == "ModuleNotFoundError"
