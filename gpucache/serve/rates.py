"""Requests per second, per credential: a token bucket for each holder (tenancy.py's
``Identity.holder``), asked from the headers alone, before a byte of the body is read.

    RateLimits(rate, burst).take(holder) -> None   taken: the request goes on
                                         -> int    refused: seconds until a request would be taken

Why before the body: a client with a valid key that floods the proxy with misses costs every
other tenant, and the concurrency share (``max_tenant_concurrency``) is only known to apply once
the body is read and keyed (an exact repeat takes no slot), so each shed request was still read
and parsed first. A bucket needs nothing but the credential, so a flood past it is answered 429
at the cost of its headers. Exact repeats count too: nothing about a request is known before its
body.

Why a bucket (``burst`` requests at once, refilled at ``rate`` a second) rather than a window:
a client that keeps within its rate is never refused for the timing of its requests, and one
that does not is told when the next will be taken (Retry-After), which the OpenAI clients honour.

A holder's bucket is forgotten once it is full again (it would take a request as a new one
does), so the buckets held are those of credentials seen in the last ``burst / rate`` seconds:
many keys, each sending once, do not grow memory beyond that.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable


class RateLimits:
    """One token bucket per holder; every call on the event loop (no lock)."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if not rate > 0 or burst < 1:
            raise ValueError(f"a rate limit needs rate > 0 and burst >= 1, got {rate!r}, {burst!r}")
        self.rate, self.burst, self.clock = rate, burst, clock
        # holder -> (tokens left, when counted), least recently touched first
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, holder: str) -> int | None:
        """None where ``holder`` may send a request now (one token taken); else the whole
        seconds (at least 1) until it may."""
        now = self.clock()
        self._forget_full(now)
        tokens, then = self._buckets.pop(holder, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.rate)
        if tokens >= 1.0:
            self._buckets[holder] = (tokens - 1.0, now)
            return None
        self._buckets[holder] = (tokens, now)
        return max(1, math.ceil((1.0 - tokens) / self.rate))

    def __len__(self) -> int:
        """How many holders' buckets are kept (those not yet full again)."""
        return len(self._buckets)

    def _forget_full(self, now: float) -> None:
        """Drop the buckets that have refilled, oldest first: a full bucket is a new one."""
        while self._buckets:
            holder, (tokens, then) = next(iter(self._buckets.items()))
            if tokens + (now - then) * self.rate < self.burst:
                return
            del self._buckets[holder]
