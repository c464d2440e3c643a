"""AdmissionPolicy: a count-min sketch checked against an exact Counter."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucache import AdmissionPolicy

keys = st.tuples(st.sampled_from(["default", "tenant-a", "tenant-b"]), st.text(max_size=12))


@settings(max_examples=60, deadline=None)
@given(st.lists(keys, max_size=300))
def test_never_under_counts_before_a_reset(stream):
    sketch = AdmissionPolicy(sketch_width=64, sketch_depth=4, reset_after=10_000)
    exact = Counter(stream)
    for scope, prompt in stream:
        sketch.record(scope, prompt)
    for (scope, prompt), count in exact.items():
        assert sketch.estimate(scope, prompt) >= count


@settings(max_examples=30, deadline=None)
@given(st.lists(keys, min_size=50, max_size=400))
def test_over_counts_stay_within_the_count_min_bound(stream):
    width, depth = 128, 4
    sketch = AdmissionPolicy(sketch_width=width, sketch_depth=depth, reset_after=10_000)
    exact = Counter(stream)
    for scope, prompt in stream:
        sketch.record(scope, prompt)
    bound = math.e * len(stream) / width  # exceeded with probability <= e^-depth per key
    over = [k for k, c in exact.items() if sketch.estimate(*k) - c > bound]
    assert len(over) <= max(1, len(exact) // 10)


def test_halving_halves_every_counter():
    sketch = AdmissionPolicy(sketch_width=1024, sketch_depth=4, reset_after=10)
    for _ in range(9):
        sketch.record("s", "often")
    assert sketch.estimate("s", "often") == 9
    sketch.record("s", "often")  # the 10th sighting triggers the halving
    assert sketch.estimate("s", "often") == 5
    assert sketch.admits("s", "often")


def test_halving_rounds_down_so_a_prompt_seen_once_ages_out():
    """A counter of 1 halves to 0: traffic seen once, long ago, is forgotten (rounding up, it
    would count as seen for ever)."""
    sketch = AdmissionPolicy(sketch_width=1024, sketch_depth=4, reset_after=4)
    sketch.record("s", "once")
    for _ in range(3):  # the 4th sighting in all triggers the halving
        sketch.record("s", "often")
    assert sketch.estimate("s", "once") == 0
    assert sketch.estimate("s", "often") == 1


def test_admits_on_the_min_sightings_th_sighting():
    sketch = AdmissionPolicy(min_sightings=3)
    assert [sketch.record("s", "p") for _ in range(3)] == [1, 2, 3]
    fresh = AdmissionPolicy(min_sightings=3)
    fresh.record("s", "p")
    assert not fresh.admits("s", "p")
    fresh.record("s", "p")
    assert not fresh.admits("s", "p")
    fresh.record("s", "p")
    assert fresh.admits("s", "p")
    assert AdmissionPolicy(min_sightings=1).admits("s", "never seen")


def test_keyed_on_exact_text_and_scope_never_on_similarity():
    sketch = AdmissionPolicy()
    sketch.record("s", "How do I reset my password?")
    assert sketch.estimate("s", "How do I reset my password?") == 1
    assert sketch.estimate("s", "how do I reset my password?") == 0
    assert sketch.estimate("other", "How do I reset my password?") == 0


def test_rows_use_independent_hashes():
    """The bug this catches: every row indexing with the same hash, so two keys that collide
    in one row collide in all of them and the minimum protects nothing."""
    width = 64
    sketch = AdmissionPolicy(sketch_width=width, sketch_depth=4)
    columns = [[i % width for i in sketch.slots("s", f"prompt {n}")] for n in range(500)]
    same_in_all_rows = sum(len(set(c)) == 1 for c in columns)
    assert same_in_all_rows < 5  # independent rows: about 500 / 64^3 expected
    # two keys sharing row 0's counter almost never share every row's
    by_row0: dict[int, list[list[int]]] = {}
    for c in columns:
        by_row0.setdefault(c[0], []).append(c)
    shared_everywhere = sum(
        1 for group in by_row0.values() for i, a in enumerate(group) for b in group[i + 1 :] if a == b
    )
    assert shared_everywhere == 0


def test_memory_is_fixed_at_width_times_depth_times_four_bytes():
    sketch = AdmissionPolicy()
    assert sketch.nbytes == 4096 * 4 * 4 == 65536
    for n in range(5000):
        sketch.record("s", f"prompt {n}")
    assert sketch.nbytes == 65536
    assert AdmissionPolicy(sketch_width=100, sketch_depth=3).nbytes == 1200


def test_default_reset_period_is_ten_times_the_width():
    assert AdmissionPolicy().reset_after == 40960
    assert AdmissionPolicy(sketch_width=100).reset_after == 1000


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_sightings": 0},
        {"sketch_width": 0},
        {"sketch_depth": 0},
        {"sketch_depth": 9},
        {"reset_after": 1},
        {"min_sightings": 2.5},
        {"sketch_width": True},
    ],
)
def test_bad_settings_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        AdmissionPolicy(**kwargs)


def test_state_round_trips_through_json():
    sketch = AdmissionPolicy(min_sightings=3, sketch_width=32, sketch_depth=2, reset_after=100)
    for n in range(40):
        sketch.record("s", f"p{n % 7}")
    copy = AdmissionPolicy.from_state(json.loads(json.dumps(sketch.state())))
    assert [copy.estimate("s", f"p{n}") for n in range(7)] == [
        sketch.estimate("s", f"p{n}") for n in range(7)
    ]
    assert copy.state() == sketch.state()
    broken = {**sketch.state(), "counters": "00"}
    with pytest.raises(ValueError, match="bytes of counters"):
        AdmissionPolicy.from_state(broken)


def test_the_same_counters_in_processes_with_different_hash_seeds():
    code = (
        "from gpucache.policy.admission import AdmissionPolicy\n"
        "s = AdmissionPolicy(sketch_width=256)\n"
        "for n in range(300): s.record(f'scope{n % 3}', f'prompt number {n % 50} ünïcode')\n"
        "print(s.state()['counters'])"
    )
    from conftest import outputs_under_hash_seeds

    outputs = outputs_under_hash_seeds(code, seeds=("0", "7", "4242"))
    assert len(outputs) == 1


def test_the_default_admits_on_the_first_repeat_and_not_before():
    """min_sightings defaults to 2: a prompt asked once is not stored, asked twice it is."""
    sketch = AdmissionPolicy()
    assert sketch.min_sightings == 2
    sketch.record("s", "asked")
    assert not sketch.admits("s", "asked")
    sketch.record("s", "asked")
    assert sketch.admits("s", "asked")


def test_a_prompt_sits_in_the_same_counters_in_every_version():
    """The slots are part of the snapshot format: a sketch saved by one version and restored by
    another must count the same prompts in the same counters (keyed blake2b, 8 bytes a row,
    little-endian, modulo the width)."""
    sketch = AdmissionPolicy()
    assert sketch.slots("default", "How do I reset my password?") == [3704, 6915, 11695, 15472]
    assert sketch.slots("tenant-a", "é") == [1563, 5441, 9913, 13331]
    # a width that is no power of two reads exactly the row's 8 bytes (a ninth would change it)
    assert AdmissionPolicy(sketch_width=1000, sketch_depth=3).slots(
        "default", "How do I reset my password?"
    ) == [150, 1918, 2933]
    small = AdmissionPolicy(sketch_width=8, sketch_depth=2)
    for prompt in ("p", "p", "q"):
        small.record("s", prompt)
    assert small.state()["counters"] == (  # uint32 little-endian, row by row
        "0000000000000000000000000000000003000000000000000000000000000000"
        "0200000001000000000000000000000000000000000000000000000000000000"
    )


def test_a_counter_saturates_at_the_largest_uint32_instead_of_overflowing():
    sketch = AdmissionPolicy(sketch_width=4, sketch_depth=1)
    state = {**sketch.state(), "counters": "ffffffff" * 4}
    full = AdmissionPolicy.from_state(state)
    assert full.estimate("s", "p") == 2**32 - 1  # a saturated counter restores unsigned
    assert full.record("s", "p") == 2**32 - 1


def test_after_a_halving_the_count_towards_the_next_one_is_halved_too():
    """The sightings since the last halving halve with the counters, as TinyLFU ages: with
    reset_after=10, the first halving comes at the 10th sighting, the next after 5 more."""
    sketch = AdmissionPolicy(sketch_width=1024, sketch_depth=4, reset_after=10)
    for _ in range(10):
        sketch.record("s", "often")
    assert sketch.estimate("s", "often") == 5 and sketch.state()["sightings"] == 5
    assert isinstance(sketch.state()["sightings"], int)
    for _ in range(4):
        sketch.record("s", "often")
    assert sketch.estimate("s", "often") == 9  # not yet halved
    sketch.record("s", "often")
    assert sketch.estimate("s", "often") == 5  # halved at the 15th: 10 >> 1


def test_snapshot_bytes_are_little_endian_on_any_machine(monkeypatch):
    from array import array

    from gpucache.policy import admission

    assert admission._little_endian(array("I", [1])).tobytes() == (1).to_bytes(4, "little")
    # on a big-endian machine the counters are byte-swapped on the way out and back in
    monkeypatch.setattr(admission.sys, "byteorder", "big")
    swapped = admission._little_endian(array("I", [1, 2**32 - 1]))
    assert swapped.typecode == "I" and swapped.tolist() == [1 << 24, 2**32 - 1]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"min_sightings": 0}, r"min_sightings must be an int in \[1, 2147483648\], got 0"),
        ({"min_sightings": 2**31 + 1}, r"min_sightings must be an int in \[1, 2147483648\]"),
        ({"sketch_width": 2**28 + 1}, r"sketch_width must be an int in \[1, 268435456\]"),
        ({"sketch_depth": 9}, r"sketch_depth must be an int in \[1, 8\], got 9"),
        ({"reset_after": 1}, r"reset_after must be an int >= 2 or None, got 1"),
        ({"reset_after": 2.5}, r"reset_after must be an int >= 2 or None, got 2.5"),
    ],
)
def test_a_bad_setting_is_named_with_its_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdmissionPolicy(**kwargs)


def test_every_setting_accepts_both_ends_of_its_range():
    for kwargs in (
        {"min_sightings": 1},
        {"min_sightings": 2**31},
        {"sketch_width": 1},
        {"sketch_depth": 1},
        {"sketch_depth": 8},
        {"reset_after": 2},
    ):
        AdmissionPolicy(**kwargs)


def test_clearing_forgets_every_sighting():
    sketch = AdmissionPolicy(sketch_width=64, reset_after=100)
    for _ in range(3):
        sketch.record("s", "p")
    sketch.clear()
    assert sketch.estimate("s", "p") == 0 and sketch.state()["sightings"] == 0
    assert sketch.nbytes == 64 * 4 * 4 and not sketch.admits("s", "p")
    assert sketch.record("s", "p") == 1
