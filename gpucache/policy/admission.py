"""AdmissionPolicy: store an answer only once its prompt has been asked often enough.

Why: in front of real traffic most prompts are asked once and never again. Every entry costs
every later lookup a row of the exact scan, so a one-off prompt stored today is paid for by
every request until it is evicted. Admitting on the ``min_sightings``-th sighting instead of the
first makes a prompt earn its place by being repeated (TinyLFU's admission idea).

How: a count-min sketch of how often each exact (scope, prompt) was asked. ``sketch_depth``
rows of ``sketch_width`` 4-byte counters (defaults 4 x 4096 = 64 KiB, whatever the traffic).
A key increments one counter per row, picked by that row's own hash; its estimate is the
minimum over its counters. Collisions only add, so the estimate never under-counts (before an
aging step); with N sightings recorded, it over-counts by more than e*N/width with probability
at most e^-depth (Cormode and Muthukrishnan, 2005). Every ``reset_after`` sightings all counters
halve, so the estimate follows recent traffic: a prompt asked twice a year apart does not look
like one asked twice this morning (Einziger, Friedman and Manes, "TinyLFU", 2017; Caffeine's
FrequencySketch ages the same way, with a sample of 10 x its capacity).

Keyed on the exact prompt text within its scope, never on similarity: a frequency estimate that
counted two different questions as one would be a false hit arriving through the write path.
Hashing is keyed blake2b over the UTF-8 bytes and the scope (``gpucache.keys.prompt_key``), so
every process and machine counts the same; no floating point and no ``hash()`` anywhere.

It decides only whether the write after a miss happens (``get_or_put``, ``get_or_put_all``,
``get_or_put_streaming`` and their async forms), never whether to serve, and never ``put`` or
``warm``: those are a caller saying "store this".
"""

from __future__ import annotations

import hashlib
import sys
from array import array

from gpucache.keys import prompt_key

_MAX_COUNT = 2**32 - 1
_HASH_KEY = b"gpucache-admission-sketch"


class AdmissionPolicy:
    """Count-min sketch admission: admit a prompt's answer on its ``min_sightings``-th sighting.

    Args:
        min_sightings: sightings (this one included) before the answer is stored; 2 admits on
            the first repeat, 1 admits everything (the same as no policy).
        sketch_width: counters per row; wider is more accurate and costs 4 bytes a counter.
        sketch_depth: rows, 1..8; more rows make an over-estimate from collisions less likely.
        reset_after: sightings after which every counter halves; None means 10 x width, the
            sample size Caffeine uses (40,960 with the default width).
    """

    name = "count-min-admission"

    def __init__(
        self,
        min_sightings: int = 2,
        *,
        sketch_width: int = 4096,
        sketch_depth: int = 4,
        reset_after: int | None = None,
    ) -> None:
        for value, what, low, high in (
            (min_sightings, "min_sightings", 1, 2**31),
            (sketch_width, "sketch_width", 1, 2**28),
            (sketch_depth, "sketch_depth", 1, 8),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{what} must be an int in [{low}, {high}], got {value!r}")
        if reset_after is None:
            reset_after = 10 * sketch_width
        if isinstance(reset_after, bool) or not isinstance(reset_after, int) or reset_after < 2:
            raise ValueError(f"reset_after must be an int >= 2 or None, got {reset_after!r}")
        self.min_sightings = min_sightings
        self.sketch_width = sketch_width
        self.sketch_depth = sketch_depth
        self.reset_after = reset_after
        self._counters = array("I", bytes(4 * sketch_width * sketch_depth))  # uint32, zeroed
        self._sightings = 0  # since the last halving

    @property
    def nbytes(self) -> int:
        """Memory held by the counters: width x depth x 4 bytes, fixed at construction."""
        return self._counters.itemsize * len(self._counters)

    def slots(self, scope: str, prompt: str) -> list[int]:
        """The counter index in each row for (scope, prompt): one independent hash per row,
        taken from disjoint 8-byte slices of one keyed blake2b digest."""
        digest = hashlib.blake2b(
            prompt_key(scope, prompt), digest_size=8 * self.sketch_depth, key=_HASH_KEY
        ).digest()
        width = self.sketch_width
        return [
            row * width + int.from_bytes(digest[8 * row : 8 * row + 8], "little") % width
            for row in range(self.sketch_depth)
        ]

    def estimate(self, scope: str, prompt: str) -> int:
        """How often (scope, prompt) has been seen: never less than the truth before a halving."""
        return min(self._counters[i] for i in self.slots(scope, prompt))

    def record(self, scope: str, prompt: str) -> int:
        """Count one sighting; returns the new estimate."""
        slots = self.slots(scope, prompt)
        for i in slots:
            if self._counters[i] < _MAX_COUNT:
                self._counters[i] += 1
        self._sightings += 1
        if self._sightings >= self.reset_after:
            self._halve()
        return min(self._counters[i] for i in slots)

    def admits(self, scope: str, prompt: str) -> bool:
        """The decision: has (scope, prompt) been seen at least ``min_sightings`` times?"""
        return self.min_sightings <= 1 or self.estimate(scope, prompt) >= self.min_sightings

    def clear(self) -> None:
        self._counters = array("I", bytes(4 * self.sketch_width * self.sketch_depth))
        self._sightings = 0

    def _halve(self) -> None:
        self._counters = array("I", (c >> 1 for c in self._counters))
        self._sightings //= 2

    # Persistence: plain ints, so a snapshot is JSON and loads without pickle.
    def state(self) -> dict[str, object]:
        return {
            "min_sightings": self.min_sightings,
            "sketch_width": self.sketch_width,
            "sketch_depth": self.sketch_depth,
            "reset_after": self.reset_after,
            "sightings": self._sightings,
            "counters": _little_endian(self._counters).tobytes().hex(),
        }

    @classmethod
    def from_state(cls, state: dict[str, object]) -> AdmissionPolicy:
        policy = cls(
            int(state["min_sightings"]),  # type: ignore[call-overload]
            sketch_width=int(state["sketch_width"]),  # type: ignore[call-overload]
            sketch_depth=int(state["sketch_depth"]),  # type: ignore[call-overload]
            reset_after=int(state["reset_after"]),  # type: ignore[call-overload]
        )
        raw = bytes.fromhex(str(state["counters"]))
        if len(raw) != policy.nbytes:
            raise ValueError(f"admission sketch has {len(raw)} bytes of counters, expected {policy.nbytes}")
        counters = array("I")
        counters.frombytes(raw)
        policy._counters = _little_endian(counters)  # the swap is its own inverse
        policy._sightings = int(state["sightings"])  # type: ignore[call-overload]
        return policy


def _little_endian(counters: array[int]) -> array[int]:
    """Snapshots store counters little-endian, whatever the machine."""
    if sys.byteorder == "little":
        return counters
    swapped = array("I", counters)
    swapped.byteswap()
    return swapped


if array("I").itemsize != 4:  # pragma: no cover - every platform CPython supports today
    raise ImportError("gpucache's admission sketch needs 4-byte unsigned ints (array 'I')")
