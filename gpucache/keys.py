"""Stable keys for an exact (scope, prompt).

One function makes the key, shared by the exact tier, the admission sketch and the tests.
Python's ``hash(str)`` is salted per process, so it would give a different key in every worker
and after every restart; blake2b of the UTF-8 bytes gives the same 16 bytes everywhere.
The scope is length-prefixed, so no choice of characters in a scope can make
(scope, prompt) collide with another split of the same bytes. ``surrogatepass`` lets a lone
surrogate (legal in a Python ``str``, not in UTF-8) still get a key.
"""

from __future__ import annotations

import hashlib

DEFAULT_SCOPE = "default"


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def prompt_key(scope: str, prompt: str) -> bytes:
    """16-byte key of the exact prompt text within its scope."""
    scope_bytes = _utf8(scope)
    data = len(scope_bytes).to_bytes(8, "little") + scope_bytes + _utf8(prompt)
    return hashlib.blake2b(data, digest_size=16).digest()
