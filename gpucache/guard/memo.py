"""The guard's memos, kept per reader: what one tenant's prompts made the guard read is never
what makes another tenant's request faster.

Why: the guard memoises what it reads (a prompt parsed, a word mended, a pair of words
compared), and mending an unusual word costs milliseconds. Shared by every tenant, the memos
were a timing channel: a long prompt of rare words another tenant had just sent cost 35 ms of
overhead against 110 ms for one never seen, in eight pairs of eight. So each memo is keyed by
the reader as well as its arguments: the cache sets the reader (the scope a prompt is looked
up or stored in) around its reading with ``reading_for``, and a memo entry made under one
reader is never found under another. The memos keep their bounds (one LRU per memo, every
reader's entries in it).

Outside any ``reading_for`` (the library's own calls, ``calibrate``, ``explain``) the reader is
the empty string: one shared memo, as before. The memos are pure functions of their arguments,
so the reader never changes an answer, only which earlier reading can make it faster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import _CacheInfo, lru_cache, update_wrapper
from typing import Any, Generic, TypeVar

R = TypeVar("R")

_READER: ContextVar[str] = ContextVar("gpucache_guard_reader", default="")


@contextmanager
def reading_for(reader: str) -> Iterator[None]:
    """Within the block, the guard's memos are ``reader``'s own (in this thread or task)."""
    token = _READER.set(reader)
    try:
        yield
    finally:
        _READER.reset(token)


def current_reader() -> str:
    return _READER.get()


class ReaderMemo(Generic[R]):
    """``functools.lru_cache`` over (reader, arguments): positional arguments only, as every
    memo of the guard is called."""

    def __init__(self, fn: Callable[..., R], maxsize: int) -> None:
        self._fn = fn
        self._cached = lru_cache(maxsize=maxsize)(self._read)
        update_wrapper(self, fn)

    def _read(self, reader: str, *args: Any) -> R:
        return self._fn(*args)

    def __call__(self, *args: Any) -> R:
        return self._cached(_READER.get(), *args)

    def cache_clear(self) -> None:
        self._cached.cache_clear()

    def cache_info(self) -> _CacheInfo:
        return self._cached.cache_info()


def reader_memo(maxsize: int) -> Callable[[Callable[..., R]], ReaderMemo[R]]:
    """The decorator: ``@reader_memo(4096)`` where ``@lru_cache(maxsize=4096)`` was."""

    def wrap(fn: Callable[..., R]) -> ReaderMemo[R]:
        return ReaderMemo(fn, maxsize)

    return wrap
