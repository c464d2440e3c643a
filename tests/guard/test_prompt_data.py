"""The LLM-prompt pairs kept in the repository: their shape, their kinds, their split."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from labelled_pairs import half_of, read_jsonl

DATA = Path(__file__).resolve().parents[2] / "data"
DEV, HELD = DATA / "llm_prompts.jsonl", DATA / "llm_prompts_heldout.jsonl"
TUNING = DATA / "llm_prompts_tuning.jsonl"  # tuning only, never reported
NEAR_MISS_KINDS = {
    "added-constraint",
    "output-language",
    "length-format",
    "audience",
    "tone",
    "programming-language",
    "without-only",
    "quantity",
    "entity",
    "direction",
    "swapped-roles",
    "changed-instruction",
}
PARAPHRASE_KINDS = {
    "fillers",
    "reordering",
    "synonyms",
    "spelling",
    "abbreviations",
    "question-form",
    "long-paraphrase",
    "mixed-paraphrase",
}


@pytest.mark.parametrize("path", [DEV, HELD, TUNING])
def test_every_row_is_a_labelled_pair_of_a_named_kind(path):
    rows = read_jsonl(path)
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert set(r) == {"a", "b", "label", "kind", "source", "id"}
        assert r["a"].strip() and r["b"].strip() and r["a"] != r["b"]
        assert r["label"] == (0 if r["kind"] in NEAR_MISS_KINDS else 1)
        assert r["kind"] in NEAR_MISS_KINDS | PARAPHRASE_KINDS
        assert r["source"].startswith("written for gpucache")


def test_the_dev_set_is_large_enough_and_covers_every_kind_in_both_halves():
    rows = read_jsonl(DEV)
    assert len(rows) >= 400
    kinds = Counter(r["kind"] for r in rows)
    assert set(kinds) == NEAR_MISS_KINDS | PARAPHRASE_KINDS
    for half in ("tune", "report"):
        assert {r["kind"] for r in rows if half_of(r["id"]) == half} == set(kinds)


def test_the_held_apart_set_shares_no_pair_with_the_dev_set():
    def key(r):
        return frozenset((r["a"].casefold(), r["b"].casefold()))

    assert not {key(r) for r in read_jsonl(DEV)} & {key(r) for r in read_jsonl(HELD)}


def test_the_tuning_only_set_shares_no_prompt_with_what_is_measured_or_tested():
    """Tuning on a prompt that a reported pair or a test also holds would fit the report."""
    measured = {t.casefold() for path in (DEV, HELD) for r in read_jsonl(path) for t in (r["a"], r["b"])}
    tests = (Path(__file__).resolve().parent / "test_lexical.py").read_text(encoding="utf-8").casefold()
    for r in read_jsonl(TUNING):
        for text in (r["a"], r["b"]):
            assert text.casefold() not in measured and f'"{text.casefold()}"' not in tests, text


def test_the_sources_page_counts_what_the_files_hold():
    page = (DATA / "SOURCES.md").read_text(encoding="utf-8")
    for path in (DEV, HELD, TUNING):
        rows = read_jsonl(path)
        labels = Counter(r["label"] for r in rows)
        assert f"| `{path.name}` | {len(rows)} | {labels[0]} / {labels[1]} |" in page


def _words(text: str) -> tuple[str, ...]:
    """A prompt as its words, case and punctuation aside: what a copy keeps."""
    return tuple(re.findall(r"[^\W_]+", text.casefold()))


def _one_word_apart(x: tuple[str, ...], y: tuple[str, ...]) -> bool:
    """Equal, or one word substituted, inserted or deleted (a copy with a name changed)."""
    if abs(len(x) - len(y)) > 1:
        return False
    i = 0
    while i < min(len(x), len(y)) and x[i] == y[i]:
        i += 1
    return x[i + 1 :] == y[i + 1 :] or x[i + 1 :] == y[i:] or x[i:] == y[i + 1 :]


def _edit(x: tuple[str, ...], y: tuple[str, ...]) -> frozenset[str]:
    """What a pair changes: the words on one side only (an order swap changes none)."""
    return frozenset(x).symmetric_difference(y)


def _copies(tested: list[tuple[str, str]], data: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Test pairs that are a data pair with at most one word changed on each side (either
    order), case and punctuation aside, making the same change between its two prompts. Two
    pairs on one template that change different words ("reset my password" / "reset my
    username" beside "reset my PW" / "reset my password") are two cases, not a copy; short
    sides (under four words) must match exactly."""

    def close(x: tuple[str, ...], y: tuple[str, ...]) -> bool:
        return x == y or (min(len(x), len(y)) >= 4 and _one_word_apart(x, y))

    by_length: dict[int, list[tuple[tuple[str, ...], tuple[str, ...]]]] = {}
    for a, b in data:
        wa, wb = _words(a), _words(b)
        by_length.setdefault(len(wa), []).append((wa, wb))
        by_length.setdefault(len(wb), []).append((wb, wa))
    found = []
    for a, b in tested:
        wa, wb = _words(a), _words(b)
        near = [p for n in (len(wa) - 1, len(wa), len(wa) + 1) for p in by_length.get(n, [])]
        if any(close(wa, x) and close(wb, y) and _edit(wa, wb) == _edit(x, y) for x, y in near):
            found.append((a, b))
    return found


def test_the_copy_finder_finds_a_copy_with_a_name_changed():
    data = [("Give me a 3 day itinerary for Rome", "Give me a 5 day itinerary for Rome")]
    assert _copies([("give me a 3 day itinerary for Paris", "Give me a 5 day itinerary for Paris!")], data)
    assert _copies([("Give me a 5-day itinerary for Rome.", "Give me a 3 day itinerary for Rome")], data)
    # the same template changing other words is another case
    assert not _copies(
        [("Give me a 3 day itinerary for Rome", "Give me a three day itinerary for Rome")], data
    )


def test_no_test_pair_is_a_pair_of_the_data():
    """A test case is written for its rule: none of the verifier's test pairs is a pair of the
    dev set, the held-apart set or the tuning-only set, in either order, nor one with a word
    changed, case or punctuation changed."""
    import test_lexical

    data = [(r["a"], r["b"]) for path in (DEV, HELD, TUNING) for r in read_jsonl(path)]
    tested = (
        [(a, b) for a, b, _ in test_lexical.MUST_REJECT]
        + list(test_lexical.MUST_ACCEPT)
        + [(a, b) for a, b, _ in test_lexical.TABLE_STILL_REJECTS]
        + list(test_lexical.STILL_SUBSTITUTIONS)
    )
    assert _copies(tested, data) == []
