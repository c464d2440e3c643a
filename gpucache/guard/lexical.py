"""LexicalNearMissVerifier: reject a candidate that is a minimal edit of the cached prompt.

Why a lexical guard: a sentence embedding averages meaning over the words, so a prompt and a
small edit of it that changes the question ("convert 10 miles to km" / "convert 10 km to
miles", "reset my password" / "reset my username") score 0.9 and above, often higher than a
true rewording. What gives a near-miss away is its shape: almost the same words, with a few
swapped, negated, renumbered or reordered. A rewording looks different: other words, other
lengths, insertions and deletions. So the verifier looks for the shape of a near-miss and lets
everything else through to the similarity threshold.

Both prompts are normalised (NFKC, lowercase, curly quotes straightened, digit groupings such
as "1,000" joined), tokenised, stripped of stopwords and reduced by a light suffix stemmer. Then
the rules below run in order; the first that fires rejects (the four founding rules the project
started from, marked by nothing, and the additions, marked [addition]):

    symbols       both prompts hold operators or symbols, and they differ
                  ("x >= 5" / "x <= 5", "a && b" / "a || b")                 -> reject  [addition]
    payload       both prompts quote or show code, and the payloads differ  -> reject  [addition]
                  (the same payload: the rules below judge the instructions
                  alone, "Summarize: '...'" / "Give me a summary of this: '...'"; payload.py)
    identical     the normalised prompts are equal                        -> accept
    numbers       the numbers differ ("5" vs "50", "two" vs "four")       -> reject
    negation      a negation appears on one side only                     -> reject
    polarity      same content words, a polarity word swapped ("to"/"from") -> reject
    antonym       a strong opposite on each side ("enable"/"disable")     -> reject  [addition]
    question-word each side asks a different wh-thing ("who" vs "when")     -> reject  [addition]
    direction     same content words reordered around a directional word  -> reject
    swapped       same content words, two of them traded places            -> reject  [addition]
                  (two words joined by "or"/"and" trade places freely: "Python or Java")
    crossed       shared words swap sides of a directional word elsewhere  -> reject  [addition]
    reordered     most content words shared (>= 5, Jaccard >= 0.6), some moved -> reject  [addition]
    substitution  content words align with only substitutions of <= 2 words each, no
                  insertions or deletions, and at least one word in common -> reject
                  (two forms of one word, "movie"/"movies", and words of one interchangeable
                  class, "good"/"best", are not substitutions)                     [addition]
    added         one prompt asks for more: content words only it has (a qualifier, a
                  clause, an instruction), beside words both share; or each side has its
                  own words in one run beside a long shared part (a different closing
                  instruction). Framing and politeness do not count.        -> reject  [addition]

Before any rule, both prompts are read through a table of interchangeable words and phrases
(interchangeable.txt: spelling variants, abbreviations and units, instruction verbs), so
"colour"/"color", "regex"/"regular expression" and "x squared"/"x^2" are the same words to
every rule.

It is conservative by design: a one-word synonym swap ("cancel" vs "end") is also rejected and
costs a miss, never a wrong answer. Any rule can be switched off (``skip``); the report's
ablation table gives, per benchmark file, the false hits and hits that costs. Everything here is
a pure function of the two strings: no floating point, no ``hash()``, no torch, so every process
and machine gives the same verdict.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gpucache.guard import shapes
from gpucache.guard.parsing import (
    exchanged,
    numbers_of,
    parse,
    parse_memo,
    token_memo,
)
from gpucache.guard.payload import operators, split
from gpucache.guard.verifier import Verdict
from gpucache.guard.words import (
    QUESTION_WORDS,
)

# The rules in the order they run: the founding rules the project started from (``SEED_RULES``:
# numbers; negation and polarity; direction; substitution) and the additions; any of them can be
# switched off (``LexicalNearMissVerifier(skip=...)``), which the false-hit report uses to show
# what each one buys.
SEED_RULES = ("numbers", "negation", "polarity", "direction", "substitution")
ADDED_RULES = ("symbols", "payload", "antonym", "question-word", "swapped", "crossed", "reordered",
               "added")
RULES = ("symbols", "payload", "numbers", "negation", "polarity", "antonym", "question-word",
         "direction", "swapped", "crossed", "reordered", "substitution", "added")


def clear_caches() -> None:
    """Forget parsed prompts and tokens (for benchmarks that time a cold verifier)."""
    parse_memo.cache_clear()
    token_memo.cache_clear()


class LexicalNearMissVerifier:
    """The default ``HitVerifier``: rejects near-miss edits, lets rewordings through.

    ``verify`` ignores the similarity: the threshold has already admitted the candidate, and
    the verifier's job is to catch what similarity cannot see.

    ``skip`` names rules (from ``RULES``) not to run. Every rule is on by default; switching one
    off trades wrong answers for hits, and the false-hit report's ablation table says how many
    of each on every benchmark file, so a deployment can decide with numbers (a cache of long
    news-like prompts loses many hits to "reordered", for instance).

    ``table=False`` reads prompts as written, without the table of interchangeable words:
    the report's ablation uses it to show what the table buys.
    """

    name = "lexical-near-miss"

    def __init__(self, skip: Iterable[str] = (), *, table: bool = True) -> None:
        if isinstance(skip, str):
            raise TypeError("skip takes a collection of rule names, not one string")
        skipped = frozenset(skip)
        unknown = sorted(skipped.difference(RULES))
        if unknown:
            raise ValueError(f"unknown rules {unknown}; the rules are {', '.join(RULES)}")
        self.skip = skipped
        self.table = bool(table)
        left_out = [r for r in RULES if r in skipped] + ([] if self.table else ["table"])
        if left_out:
            self.name = f"lexical-near-miss-without-{'-'.join(left_out)}"

    def __repr__(self) -> str:
        skipped = ", ".join(repr(r) for r in RULES if r in self.skip)
        table = "" if self.table else ", table=False"
        return (f"LexicalNearMissVerifier(skip=({skipped}{',' if len(self.skip) == 1 else ''})"
                f"{table})")

    def verify(self, cached_prompt: str, new_prompt: str, similarity: float) -> bool:
        return not self.explain(cached_prompt, new_prompt).rejected

    def explain(self, cached_prompt: str, new_prompt: str) -> Verdict:
        """Which rule decides this pair, and the words involved."""
        skip = self.skip
        ops_a, ops_b = operators(cached_prompt), operators(new_prompt)
        if ops_a and ops_b and ops_a != ops_b and "symbols" not in skip:
            return Verdict(True, "symbols", f"symbols differ: {' '.join(ops_a)} vs {' '.join(ops_b)}",
                           ops_a + ops_b)
        split_a, split_b = split(cached_prompt), split(new_prompt)
        cached_prompt, new_prompt = split_a.plain, split_b.plain
        if split_a.payloads and split_b.payloads and "payload" not in skip:
            if split_a.payloads != split_b.payloads:
                return Verdict(True, "payload", "the quoted or code payloads differ")
            # one payload, two instructions: the rules below judge the instructions
            cached_prompt, new_prompt = split_a.instruction, split_b.instruction
        a, b = parse(cached_prompt, self.table), parse(new_prompt, self.table)
        if a.norm == b.norm:
            return Verdict(False, "identical")
        nums_a, nums_b = numbers_of(a, b), numbers_of(b, a)
        if nums_a != nums_b and "numbers" not in skip:
            diff_a = sorted((Counter(nums_a) - Counter(nums_b)).elements())
            diff_b = sorted((Counter(nums_b) - Counter(nums_a)).elements())
            return Verdict(
                True, "numbers", f"numbers differ: {' '.join(diff_a) or '-'} vs "
                f"{' '.join(diff_b) or '-'}", tuple(diff_a + diff_b)
            )
        if (a.negations > 0) != (b.negations > 0) and "negation" not in skip:
            return Verdict(True, "negation", "a negation on one side only", ("not",))
        if (
            a.core == b.core and a.polarity != b.polarity and "polarity" not in skip
            and shapes.poles_swapped(a.polarity, b.polarity)
        ):
            words = shapes.polar_words(a, b)
            return Verdict(True, "polarity", f"polarity swapped: {' vs '.join(words)}", words)
        opposite = shapes.split_antonym(a.surface, b.surface) if "antonym" not in skip else None
        if opposite:
            return Verdict(True, "antonym", f"opposites: {opposite[0]} vs {opposite[1]}", opposite)
        asks_a = QUESTION_WORDS.intersection(a.tokens)
        asks_b = QUESTION_WORDS.intersection(b.tokens)
        if asks_a and asks_b and not asks_a & asks_b and "question-word" not in skip:
            words = (" ".join(sorted(asks_a)), " ".join(sorted(asks_b)))
            return Verdict(True, "question-word", f"asks {words[0]} vs {words[1]}", words)
        same_content = a.bag == b.bag
        if (
            same_content and a.directions == b.directions and a.attachments != b.attachments
            and "direction" not in skip
        ):
            moved = tuple(sorted({o for _, o in set(a.attachments) ^ set(b.attachments)}))
            return Verdict(
                True, "direction", f"reordered around a directional word: {' '.join(moved)}", moved
            )
        if same_content and a.content != b.content and "swapped" not in skip:
            # content words trading places, or a content word trading places with a word the
            # parser sets aside ("Is Rust faster than Go?": "go" is a stopword, and a name)
            in_tokens = exchanged(a.tokens, b.tokens)
            swap = exchanged(a.skeleton, b.skeleton) or in_tokens
            if swap and not shapes.coordinated(a.tokens, *swap):
                return Verdict(True, "swapped", f"words traded places: {swap[0]} / {swap[1]}", swap)
            if in_tokens:
                # word for word the same prompt but for "A or B" / "B or A": the later rules
                # would read the exchange as words moved
                return Verdict(False, "rewording")
        crossed = shapes.crossed(a, b) if "crossed" not in skip else None
        if crossed:
            return Verdict(
                True, "crossed", f"{crossed[0]} and {crossed[1]} swap sides of a directional word",
                crossed,
            )
        moved = shapes.reordered(a, b) if "reordered" not in skip else ()
        if moved:
            shown = " ".join(moved)
            return Verdict(True, "reordered", f"shared words moved: {shown}", moved)
        subs = shapes.substitutions(a.content, b.content) if "substitution" not in skip else []
        if subs:
            words = tuple(w for pair in subs for w in pair)
            shown = ", ".join(f"{x} -> {y}" for x, y in subs)
            return Verdict(True, "substitution", f"words substituted: {shown}", words)
        added = shapes.added(a, b) if "added" not in skip else None
        if added:
            only_a, only_b = added
            shown = "; ".join(
                f'only in the {side} prompt: "{shapes.phrase(p, only)}"'
                for side, p, only in (("cached", a, only_a), ("new", b, only_b)) if only
            )
            return Verdict(True, "added", shown, only_a + only_b)
        return Verdict(False, "rewording")
