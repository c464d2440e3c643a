"""LexicalNearMissVerifier: refuse a candidate when the two prompts differ in a named way.

Why: a sentence embedding averages meaning over the words, so a prompt and a small edit of it
that changes the question ("convert 10 miles to km" / "convert 10 km to miles", "reset my
password" / "reset my username") score 0.9 and above, often higher than a true rewording. An
earlier design refused edits by their *shape* (any word substituted, added or moved), and
natural rewordings have those shapes too: typos, shorthand, greetings and thanks, synonyms,
reordered clauses. So this verifier first reads what each prompt asks (request.py: framing at
the ends dropped, shorthand written out, misspellings mended), matches the two prompts' words
to each other (differences.py: same word, stem, the interchangeable table, a misspelling one
edit from the other side's word) and then refuses only where what is left unmatched, or what
changed place, is a difference it can name. Everything else passes to the similarity
threshold. The rules, in the order they run (the founding rules the project started from are
unmarked, the additions marked [addition]); the first that fires decides:

    symbols       both prompts hold operators or symbols, and they differ
                  ("x >= 5" / "x <= 5", "a && b" / "a || b")                     [addition]
    payload       both prompts quote or show code, and the payloads differ      [addition]
                  (the same payload: the rules below judge the instructions alone)
    identical     the normalised requests are equal                          -> accept
    numbers       the numbers differ ("5" / "50", "two" / "four", "-1" / "1")
    negation      a negation of the request on one side only
    polarity      same content words, a polarity word swapped ("to" / "from")
    antonym       a strong opposite on each side ("enable" / "disable")        [addition]
    confusable    words a letter apart that mean different things ("desert" /
                  "dessert", "mg" / "mcg"): confusables.txt                    [addition]
    question-word each side asks a different wh-thing ("who" / "when")          [addition]
    direction     same content words reordered around a directional word
    swapped       same content words, two of them traded places               [addition]
    voice         who did what to whom exchanged across active and passive     [addition]
    roles         a shared word hangs from another shared word in each prompt, through
                  a directional word, and from different ones ("born in Paris, moved to
                  London" / "born in London, moved to Paris")                  [addition]
    crossed       two shared words swap sides of a role word (to, from, into, than, by, per)
                  in prompts of at most eight content words each              [addition]
    relation      "X percent of Y" / "what percent of Y is X"; "and" / "or"  [addition]
    entity, deliverable, audience, tone, time
                  a word of that kind (categories.txt; or a name written with a capital)
                  that only one prompt has                                     [addition]
    constraint    a span only one prompt has, opened by a restricting word
                  ("without eggs", "for a vegan", "on Windows", "that sounds French")
                                                                               [addition]
    reordered     a near-identical edit (at most two words differ on each side beside a
                  shared one) of eight shared words or more, some moved one by one rather
                  than in whole clauses                                        [addition]
    substitution  a near-identical edit whose content words align by substitution only
    added         a near-identical edit where one prompt asks for one or two words more
                                                                               [addition]

The last three are shape checks, kept for the band where they were written:
outside it they abstain. Any rule can be switched off (``skip``). Everything here is a pure
function of the two strings and shipped data: no floating point, no ``hash()``, no torch, so
every process and machine gives the same verdict.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gpucache.guard import differences, parsing, payload, quantities, request, roles, shapes
from gpucache.guard.parsing import EXPOSITION, FRAMING_READ, Parsed, exchanged, numbers_of, parse
from gpucache.guard.payload import grouping, operators, split
from gpucache.guard.request import dictionary, request_text
from gpucache.guard.verifier import Verdict
from gpucache.guard.words import CONFUSABLE, QUESTION_WORDS, adverb

# The rules in the order they run: the founding rules the project started from (``SEED_RULES``:
# numbers; negation and polarity; direction; substitution) and the additions; any of them can be
# switched off (``LexicalNearMissVerifier(skip=...)``), which the false-hit report uses to show
# what each one buys.
# The added rule judges short requests only: beside two to four shared content words, one or two
# more are a qualifier ("a funny limerick about a cat"); beside more, they are as often how
# someone else puts the same request.
ADDED_MIN_SHARED, ADDED_MAX_SHARED = 2, 4
# The reordered rule judges long near-identical sentences only (eight shared content words or
# more): there single words moved one by one are a scrambled near-miss; in a short request a
# moved word is how another user puts it ("the seller cancelled my order" / "my order was
# cancelled by the seller").
REORDER_MIN_SHARED = 8
# Nouns that name the kind of thing a question asks for, which the question already implies
# ("Who was the person who wrote X" / "Who wrote X", "the symbol for the element gold"): one
# prompt having one more of them asks for nothing more.
RESTATING = frozenset(parsing.stem_memo(w) for w in "person element city country place".split())
SEED_RULES = ("numbers", "negation", "polarity", "direction", "substitution")
NAMED_KINDS = differences.KINDS[:-1]  # entity, deliverable, audience, tone, time
RULES = (
    "symbols",
    "payload",
    "numbers",
    "negation",
    "polarity",
    "antonym",
    "confusable",
    "question-word",
    "direction",
    "swapped",
    "voice",
    "roles",
    "crossed",
    "relation",
    *NAMED_KINDS,
    "constraint",
    "reordered",
    "substitution",
    "added",
)
ADDED_RULES = tuple(rule for rule in RULES if rule not in SEED_RULES)
# The shape checks the learned and the pair decisions weigh instead of obeying (features.py,
# pair.py): a soft rule judged by an edit's shape, not by a difference it can name. The
# constraint rule names one ("without eggs"), so those decisions keep it as a veto.
# (gpucache calibrate may also skip constraint: guard/settings.py SOFT_RULES)
SHAPE_RULES = ("substitution", "added", "reordered", "crossed")


# Every memo of a prompt, a word or a part of one the verdict is computed through.
MEMOS = parsing.MEMOS + request.MEMOS + payload.MEMOS + differences.MEMOS


def clear_caches() -> None:
    """Forget every prompt, word and part the verifier has read: a benchmark that times a cold
    verifier starts from nothing, and a test's verdict never rests on what an earlier test read."""
    for memo in MEMOS:
        memo.cache_clear()


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
        dictionary()  # loaded here, once per process, never on a lookup's path
        left_out = [r for r in RULES if r in skipped] + ([] if self.table else ["table"])
        if left_out:
            self.name = f"lexical-near-miss-without-{'-'.join(left_out)}"

    def __repr__(self) -> str:
        skipped = ", ".join(repr(r) for r in RULES if r in self.skip)
        table = "" if self.table else ", table=False"
        return f"LexicalNearMissVerifier(skip=({skipped}{',' if len(self.skip) == 1 else ''}){table})"

    def verify(self, cached_prompt: str, new_prompt: str, similarity: float) -> bool:
        return not self.explain(cached_prompt, new_prompt).rejected

    def request(self, prompt: str) -> str:
        """What the cache embeds of a prompt for its semantic tier: the request without its
        framing (request.py), so a chatty wrapper does not fall below the threshold."""
        return request_text(prompt)

    def explain(self, cached_prompt: str, new_prompt: str) -> Verdict:
        """Which rule decides this pair, and the words involved."""
        skip = self.skip
        ops_a, ops_b = operators(cached_prompt), operators(new_prompt)
        if ops_a and ops_b:  # operators on both sides: their grouping is part of them
            ops_a, ops_b = ops_a + grouping(cached_prompt), ops_b + grouping(new_prompt)
        if ops_a and ops_b and ops_a != ops_b and "symbols" not in skip:
            return Verdict(
                True, "symbols", f"symbols differ: {' '.join(ops_a)} vs {' '.join(ops_b)}", ops_a + ops_b
            )
        split_a, split_b = split(cached_prompt), split(new_prompt)
        cached_prompt, new_prompt = split_a.plain, split_b.plain
        if split_a.payloads and split_b.payloads and "payload" not in skip:
            if split_a.payloads != split_b.payloads:
                return Verdict(True, "payload", "the quoted or code payloads differ")
            # one payload, two instructions: the rules below judge the instructions
            cached_prompt, new_prompt = split_a.instruction, split_b.instruction
        text_a, text_b = differences.reconcile(request_text(cached_prompt), request_text(new_prompt))
        a, b = parse(text_a, self.table), parse(text_b, self.table)
        if numbers_of(a, b) != numbers_of(b, a):  # the same amount in other units, perhaps
            text_a, text_b, a, b = self._amounts(text_a, text_b, a, b)
        if a.tokens == b.tokens:
            signs_a, signs_b = differences.signed_numbers(text_a), differences.signed_numbers(text_b)
            if signs_a != signs_b and "numbers" not in self.skip:
                return Verdict(
                    True,
                    "numbers",
                    f"signs differ: {' '.join(signs_a) or '-'} vs {' '.join(signs_b) or '-'}",
                    signs_a + signs_b,
                )
            return Verdict(False, "identical")
        norm = lambda t: parse(t, self.table).tokens  # noqa: E731
        extra = differences.extra_segments(text_a, text_b, norm)
        if extra is not None:
            return self._extra(extra[0], extra[1])
        rests = differences.differing_segments(text_a, text_b, norm)
        if rests is not None:
            return self._instructions(*rests)
        return self._named(text_a, text_b, a, b) or Verdict(False, "rewording")

    def _amounts(self, text_a: str, text_b: str, a: Parsed, b: Parsed) -> tuple[str, str, Parsed, Parsed]:
        """The two requests read with every amount in one unit per quantity (quantities.py),
        where that makes their numbers agree ("2 minutes" / "120 seconds"); else as they were."""
        ca, cb = quantities.canonical(text_a), quantities.canonical(text_b)
        if (ca, cb) == (text_a, text_b):
            return text_a, text_b, a, b
        pa, pb = parse(ca, self.table), parse(cb, self.table)
        if numbers_of(pa, pb) != numbers_of(pb, pa) or differences.signed_numbers(
            ca
        ) != differences.signed_numbers(cb):
            return text_a, text_b, a, b
        return ca, cb, pa, pb

    def _instructions(self, rest_a: str, rest_b: str) -> Verdict:
        """The two prompts share sentences and differ in the others: those are judged alone,
        and where they share no content word at all they ask for different things ("...
        Explain the indexing options." / "... Suggest a schema change.")."""
        a, b = parse(rest_a, self.table), parse(rest_b, self.table)
        named = self._named(rest_a, rest_b, a, b)
        if named is not None:
            return named
        words_a = set(a.content) - FRAMING_READ
        words_b = set(b.content) - FRAMING_READ
        if words_a and words_b and not words_a & words_b and "added" not in self.skip:
            return Verdict(
                True,
                "added",
                f'each prompt asks its own: "{rest_a}" / "{rest_b}"',
                tuple(sorted(words_a | words_b)),
            )
        return Verdict(False, "rewording")

    def _extra(self, where: str, sentences: tuple[str, ...]) -> Verdict:
        """One prompt is the other with whole sentences more. Before the request they are
        context ("I've been at this for 2 hours and it isn't working."): a number or a "not" in
        them changes nothing asked, but a name or a qualifier does ("I'm vegan."). After it,
        they ask for more ("Include the commands you would run.")."""
        text = " ".join(sentences)
        p = parse(text, self.table)
        if where == "tail" and "added" not in self.skip and any(w not in FRAMING_READ for w in p.content):
            return Verdict(True, "added", f'only one prompt goes on to ask: "{text}"', p.content)
        names = differences.capitalised(text)
        for kind, word in differences.named_kinds(p.content, names):
            if kind in ("entity", "constraint", "audience") and kind not in self.skip:
                return Verdict(
                    True, kind, f"{kind} named only in the context one prompt gives: {word}", (word,)
                )
        return Verdict(False, "context")

    def _named(self, text_a: str, text_b: str, a: Parsed, b: Parsed) -> Verdict | None:
        """The first rule that names a difference between the two requests, or None."""
        skip = self.skip
        nums_a, nums_b = numbers_of(a, b), numbers_of(b, a)
        signs_a, signs_b = differences.signed_numbers(text_a), differences.signed_numbers(text_b)
        if (nums_a != nums_b or signs_a != signs_b) and "numbers" not in skip:
            if nums_a == nums_b:
                nums_a, nums_b = signs_a, signs_b
            diff_a = sorted((Counter(nums_a) - Counter(nums_b)).elements())
            diff_b = sorted((Counter(nums_b) - Counter(nums_a)).elements())
            return Verdict(
                True,
                "numbers",
                f"numbers differ: {' '.join(diff_a) or '-'} vs {' '.join(diff_b) or '-'}",
                tuple(diff_a + diff_b),
            )
        if a.negated != b.negated and "negation" not in skip:
            return Verdict(True, "negation", "a negation on one side only", ("not",))
        if (
            a.core == b.core
            and a.polarity != b.polarity
            and "polarity" not in skip
            and shapes.poles_swapped(a.polarity, b.polarity)
        ):
            words = shapes.polar_words(a, b)
            return Verdict(True, "polarity", f"polarity swapped: {' vs '.join(words)}", words)
        opposite = shapes.split_antonym(a.surface, b.surface) if "antonym" not in skip else None
        if opposite:
            return Verdict(True, "antonym", f"opposites: {opposite[0]} vs {opposite[1]}", opposite)
        diff = differences.align(a, b)
        confused = _confused(diff) if "confusable" not in skip else None
        if confused:
            return Verdict(
                True,
                "confusable",
                f"different words a letter apart: {confused[0]} vs {confused[1]}",
                confused,
            )
        asks_a = QUESTION_WORDS.intersection(a.tokens)
        asks_b = QUESTION_WORDS.intersection(b.tokens)
        if asks_a and asks_b and not asks_a & asks_b and "question-word" not in skip:
            words = (" ".join(sorted(asks_a)), " ".join(sorted(asks_b)))
            return Verdict(True, "question-word", f"asks {words[0]} vs {words[1]}", words)
        same_content = a.bag == b.bag
        if (
            same_content
            and a.directions == b.directions
            and a.attachments != b.attachments
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
            if swap and not shapes.coordinated(a.tokens, *swap) and not adverb(*swap):
                return Verdict(True, "swapped", f"words traded places: {swap[0]} / {swap[1]}", swap)
            if in_tokens:
                # word for word the same prompt but for "A or B" / "B or A"
                return Verdict(False, "rewording")
        voice = roles.voice_roles(a, b) if "voice" not in skip else None
        if voice:
            return Verdict(
                True,
                "voice",
                f"who does what to whom: {voice[0]} / {voice[1]} exchanged across the voice of the verb",
                voice,
            )
        role = roles.roles_changed(a, b) if "roles" not in skip else None
        if role:
            return Verdict(
                True,
                "roles",
                f"{role[0]} hangs from {role[1]} in the cached prompt and from {role[2]} in the new one",
                (role[0],),
            )
        crossed = shapes.crossed(a, b) if "crossed" not in skip else None
        if crossed:
            return Verdict(
                True, "crossed", f"{crossed[0]} and {crossed[1]} swap sides of a role word", crossed
            )
        if "relation" not in skip:
            if differences.percent_relation(text_a, text_b):
                return Verdict(
                    True, "relation", "a percentage given on one side, asked on the other", ("percent",)
                )
            if differences.coordination_changed(a, b):
                return Verdict(True, "relation", "'and' against 'or'", ("and", "or"))
        # a name told by its capital alone ("Nintendo 3DS games" / "3DS games") counts where it
        # replaces another word or the edit is near-identical: capitals are typed loosely, and
        # a question asked at more length often names what the shorter one leaves implied
        names = differences.capitalised(text_a) | differences.capitalised(text_b)
        if not (diff.near_identical or (diff.only_a and diff.only_b)):
            names = frozenset()
        for kind, word, side in _kinds(diff, names, set(a.content), set(b.content)):
            if kind not in skip:
                return Verdict(True, kind, f"{kind} named only in the {side} prompt: {word}", (word,))
        if "constraint" not in skip:
            span_a = differences.restricted_span(a, diff.only_a, alone=not diff.only_b)
            span_b = differences.restricted_span(b, diff.only_b, alone=not diff.only_a)
            if bool(span_a) != bool(span_b):  # a span on each side is a rewording of it
                side, span = ("cached", span_a) if span_a else ("new", span_b)
                return Verdict(
                    True,
                    "constraint",
                    f"only the {side} prompt restricts the request: {' '.join(span)}",
                    span,
                )
        if not diff.near_identical:
            return None  # the shape rules below judge near-identical edits only
        if diff.shared >= REORDER_MIN_SHARED and "reordered" not in skip:
            moved = shapes.reordered(a, b)
            if moved:
                return Verdict(True, "reordered", f"shared words moved: {' '.join(moved)}", moved)
        subs = shapes.substitutions(a.content, b.content) if "substitution" not in skip else []
        if subs:
            words = tuple(w for pair in subs for w in pair)
            shown = ", ".join(f"{x} -> {y}" for x, y in subs)
            return Verdict(True, "substitution", f"words substituted: {shown}", words)
        # words the other prompt also has, a wh-word or an instruction to explain are no request
        # of their own ("Alan Turing" / "he", "Who was X?" / "Tell me about X")
        extra = tuple(w for w in diff.only_a or diff.only_b if w not in a.content or w not in b.content)
        other = b.content if diff.only_a else a.content
        extra = tuple(
            w
            for w in extra
            if w not in QUESTION_WORDS
            and w not in EXPOSITION
            and w not in RESTATING
            and not any(shapes.variants(w, o) for o in other)
        )
        one_sided = bool(diff.only_a) != bool(diff.only_b)
        short = ADDED_MIN_SHARED <= diff.shared <= ADDED_MAX_SHARED
        if extra and one_sided and short and "added" not in skip:
            side = "cached" if diff.only_a else "new"
            return Verdict(True, "added", f'only the {side} prompt asks for "{" ".join(extra)}"', extra)
        return None


def _confused(diff: differences.Difference) -> tuple[str, str] | None:
    for x in diff.only_a:
        for y in diff.only_b:
            if y in CONFUSABLE.get(x, ()):
                return x, y
    return None


def _kinds(
    diff: differences.Difference, names: frozenset[str], words_a: set[str], words_b: set[str]
) -> list[tuple[str, str, str]]:
    """(kind, word, side) of each word only one prompt has that names what it is for (a word
    the other prompt also has, fewer times, is no difference of kind)."""
    found = [
        (kind, w, "cached") for kind, w in differences.named_kinds(diff.only_a, names) if w not in words_b
    ]
    found += [(kind, w, "new") for kind, w in differences.named_kinds(diff.only_b, names) if w not in words_a]
    order = {k: i for i, k in enumerate(differences.KINDS)}
    return sorted(found, key=lambda f: order[f[0]])
