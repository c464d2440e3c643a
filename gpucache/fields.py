"""One way to declare a setting, for every settings tree (cache, embedder, replication, serve):
a dataclass field with a default, its documentation, and what else the layer that reads the
tree needs of it (``metadata``: the cache's ``shown``/``saved``, the server's ``flag``/``secret``).
The settings pages (docs/settings.md, docs/library-settings.md) and the command line's help are
made from these fields, so a setting is documented where it is declared. Importing this module
imports nothing of the package: a settings module stays light. ``without_password`` is how a
setting's value is shown where it may hold a URL with a password (a Redis URL)."""

from __future__ import annotations

from dataclasses import field
from typing import Any
from urllib.parse import urlsplit, urlunsplit


def setting(default: Any, doc: str, *, repr: bool = True, **metadata: Any) -> Any:
    """``repr=False`` for a secret: the dataclass's own repr leaves it out (a settings tree
    printed or logged would show it otherwise)."""
    return field(default=default, repr=repr, metadata={"doc": doc, **metadata})


def without_password(value: Any) -> Any:
    """``value`` with a URL's password shown as ``***`` (``redis://:pw@host``), anything else as
    it is: a URL printed by ``gpucache info``, logged or in an error gives no credential away."""
    if not isinstance(value, str) or "@" not in value:
        return value
    parts = urlsplit(value)
    if parts.password is None:
        return value
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
