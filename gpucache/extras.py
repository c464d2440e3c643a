"""What an optional part of gpucache needs installed, and the error that says so.

Why: gpucache installs in three tiers (docs/architecture.md, "Tiers"). The *values* (settings,
keys, typed answers, the guard, the policies) need the standard library alone; the *engine*
(the index, the embedder, the cache core) needs the core dependencies (torch, numpy,
transformers, safetensors); each *extra* (the proxy, the Redis share, the LangChain adapter)
needs libraries that only its extra installs. An extra's module imports its libraries at its
top, inside ``try``, and turns a missing one into ``MissingExtra``: the ImportError that a user
who reached the module without the extra sees, naming the extra to install instead of a bare
``No module named 'starlette'`` (httpx does the same for its command line and its brotli
decoder). The command catches it and exits 2 with that line.

This module imports nothing of the package and nothing outside the standard library.
"""

from __future__ import annotations

# Each extra and the libraries its modules import (what pyproject.toml's extra installs; the
# tests block each set to check the tiers)
EXTRAS: dict[str, tuple[str, ...]] = {
    "serve": ("fastapi", "starlette", "uvicorn", "httpx", "prometheus_client", "orjson", "httptools"),
    "share": ("redis",),
    "langchain": ("langchain_core",),
}


class MissingExtra(ImportError):
    """A module of an optional part was imported without its extra installed. ``extra`` names
    the extra, ``name`` (as for any ImportError) the library that is missing."""

    def __init__(self, extra: str, library: str | None, what: str) -> None:
        super().__init__(
            f"{what} needs the '{extra}' extra ({library or 'a library'} is not installed): "
            f"pip install 'gpucache[{extra}]' (from a checkout: bash scripts/install.sh {extra})",
            name=library,
        )
        self.extra = extra


def missing(extra: str, what: str, cause: ImportError) -> MissingExtra:
    """The error to raise from ``cause``, an ImportError of a library of ``extra`` met while
    importing ``what`` (a module, or the feature it serves)."""
    if isinstance(cause, MissingExtra):
        return cause
    return MissingExtra(extra, cause.name, what)
