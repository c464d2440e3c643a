"""An ``Exchange`` for the proxy's unit tests: a chat request already read and keyed."""

from __future__ import annotations

from gpucache.serve.exchange import CacheControl, Exchange


def exchange() -> Exchange:
    """A chat request for model "smol", with no key (what answers and streams read of it)."""
    return Exchange(
        kind="chat",
        method="POST",
        headers={},
        query={},
        raw=b"{}",
        body={"model": "smol"},
        key=None,  # type: ignore[arg-type]
        control=CacheControl(),
    )
