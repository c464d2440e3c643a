"""The package as a whole: how its modules depend on each other, read from their source.

Why: a module that reads another's private names, or two modules that import each other, make
every change to one a change to both. These tests read the source (``ast``), so they hold for
imports made only for type checking and inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpucache import SemanticCache

PACKAGE = Path(__file__).resolve().parents[1] / "gpucache"
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    """Every module of the package that ``path`` imports, wherever the import statement is."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        out.update(n for n in names if n in known)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def _package_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {name: _imports(path, modules) for name, path in modules.items()}
    for name in graph:  # a package's __init__ importing its own modules is not a dependency back
        graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    return graph


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_two_modules_of_the_package_import_each_other_even_for_type_checking():
    assert _cycles(_package_graph()) == []


# Names of the standard library's documented API that start with an underscore
STANDARD_UNDERSCORED = {("os", "_exit")}


def _private_reads(path: Path) -> list[str]:
    """``x._name`` where ``x`` is not ``self``/``cls`` and this module does not define
    ``_name`` itself (as ``self._name = ...``, a method or a class attribute), nor is ``x``
    torch (whose private operators the CPU paths call by design, each with a probe), nor is it
    a documented name of the standard library's that starts with an underscore (``os._exit``)."""
    tree = ast.parse(path.read_text())
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
    reads = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        base = ast.unparse(node.value)
        if base in ("self", "cls") or base.split(".")[0] == "torch" or node.attr in own:
            continue
        if (base, node.attr) in STANDARD_UNDERSCORED:
            continue
        reads.append(f"{path.name}:{node.lineno} {base}.{node.attr}")
    return reads


def test_the_private_name_finder_finds_a_reach_in(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f(cache):\n    return cache._table\n")
    assert _private_reads(module) == ["m.py:2 cache._table"]
    module.write_text(
        "class A:\n    def __init__(self):\n        self._t = 1\n    def g(self, o):\n        return o._t\n"
    )
    assert _private_reads(module) == []  # its own class's name, on another instance


def test_no_module_reads_another_modules_private_names():
    reads = [r for path in _modules().values() for r in _private_reads(path)]
    assert reads == []


def _private_imports(path: Path) -> list[str]:
    """``from gpucache.x import _name``: a name another module keeps to itself."""
    return [
        f"{path.name}:{node.lineno} {node.module}.{alias.name}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpucache")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]


def test_no_module_imports_another_modules_private_names(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from gpucache.guard.words import _stem, STOPWORDS\n")
    assert _private_imports(module) == ["m.py:1 gpucache.guard.words._stem"]  # the finder finds
    assert [i for path in _modules().values() for i in _private_imports(path)] == []


def test_no_module_of_the_package_is_longer_than_a_reader_holds_at_once():
    """A module over the limit does more than one part's work: split it where its parts meet."""
    lengths = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}


def test_every_package_of_the_tree_is_installed_with_the_library():
    """pyproject.toml lists the packages by name: one added to the tree and not listed there
    would be missing from an installed (non-editable) gpucache."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = PACKAGE.parent
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    in_tree = {".".join(p.parent.relative_to(root).parts) for p in (root / "gpucache").rglob("__init__.py")}
    assert in_tree == listed
    assert "package-dir" not in config  # every package where its name says


def test_nothing_at_the_repository_root_can_be_imported_in_place_of_another_distribution():
    """Commands run from the checkout put its root first on sys.path: a package or module there
    is imported in place of an installed one of the same name. A top-level kernels/ folder did
    that to the `kernels` distribution transformers imports, and the first command failed."""
    root = PACKAGE.parent
    importable = sorted(
        p.name for p in root.iterdir() if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"
    )
    assert importable == ["gpucache"]


def _layout_names() -> set[str]:
    """The file names the layout (docs/architecture.md) mentions."""
    import re

    section = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = section[section.index("```") + 3 :]
    block = block[: block.index("```")]
    return set(re.findall(r"[\w-]+\.(?:py|txt)\b", block))


def test_the_layout_page_names_every_module_and_only_modules_that_exist():
    named = _layout_names()
    tree = {p.name for p in (PACKAGE.parent).rglob("*") if not {".git", ".venv"} & set(p.parts)}
    assert sorted(named - tree) == []  # nothing named that is gone
    modules = {
        p.name
        for p in PACKAGE.rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py") and p.parent.name != "engines"
    }
    modules |= {p.name for p in (PACKAGE.parent / "bench").glob("*.py")}
    assert sorted(modules - named) == []  # nothing in the tree left unsaid (engines are named by kind)


def _core_reads(path: Path) -> list[str]:
    """``<something cache>.core`` or ``._core``: a read of a cache's core through its facade."""
    reads = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in ("core", "_core"):
            base = ast.unparse(node.value)
            if base.split(".")[-1].lower().endswith("cache"):
                reads.append(f"{path.name}:{node.lineno} {base}.{node.attr}")
    return reads


def test_the_core_finder_finds_a_reach_through_the_facade(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "def f(self):\n    return self.cache.core.replay('x'), parsed.core, cache._core.table\n"
    )
    assert sorted(_core_reads(module)) == ["m.py:2 cache._core", "m.py:2 self.cache.core"]


def test_nothing_outside_the_cache_package_reaches_into_a_caches_core():
    """The facade (SemanticCache) is the cache's face: what the proxy, the metrics, the
    lifecycle and the adapters need of it is a method there (restore, may_store, replay_chunks,
    lookup_batches), so the core can change behind it."""
    outside = [path for name, path in _modules().items() if not name.startswith("gpucache.cache")]
    outside += sorted((PACKAGE.parent / "bench").glob("*.py")) + sorted(
        (PACKAGE.parent / "examples").rglob("*.py")
    )
    reads = [read for path in outside for read in _core_reads(path)]
    assert reads == []
    assert not hasattr(SemanticCache, "core")  # the facade offers no door to it
