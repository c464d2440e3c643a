"""Who does what to whom, and what hangs from what, in two prompts: a role exchanged across the
voice of a verb ("did Rome defeat Carthage" / "was Rome defeated by Carthage") or a word that
hangs from another head through a directional word ("born in Paris and moved to London" / "born
in London and moved to Paris"). The words are the same on both sides, so ``align`` (
differences.py) sees no difference; the roles are what changed. Pure functions of the parsed
texts and the tables here: no floating point, no ``hash()``.
"""

from __future__ import annotations

from gpucache.guard.parsing import EXPOSITION, FRAMING_READ, Parsed
from gpucache.guard.words import adverb

# Auxiliaries that make a passive ("was defeated by"), and irregular participles the light
# stemmer does not bring back to their verb.
BE_FORMS = frozenset("is are was were be been being get got gets".split())
IRREGULAR = {
    "taught": "teach",
    "bought": "buy",
    "caught": "catch",
    "thought": "think",
    "brought": "bring",
    "fought": "fight",
    "sought": "seek",
    "written": "write",
    "wrote": "write",
    "beaten": "beat",
    "eaten": "eat",
    "given": "give",
    "gave": "give",
    "taken": "take",
    "took": "take",
    "chosen": "choose",
    "chose": "choose",
    "driven": "drive",
    "drove": "drive",
    "bitten": "bite",
    "bit": "bite",
    "known": "know",
    "knew": "know",
    "shown": "show",
    "seen": "see",
    "saw": "see",
    "made": "make",
    "paid": "pay",
    "sold": "sell",
    "told": "tell",
    "won": "win",
    "led": "lead",
    "held": "hold",
    "left": "leave",
    "met": "meet",
    "sent": "send",
    "built": "build",
    "hit": "hit",
    "struck": "strike",
    "killed": "kill",
}


def _verb(word: str) -> str:
    """A verb's form to compare: irregular participles to their verb, a final "e" dropped
    ("invade" and "invaded", stemmed "invad", are one verb)."""
    word = IRREGULAR.get(word, word)
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


def voice_roles(a: Parsed, b: Parsed) -> tuple[str, str] | None:
    """Who does what to whom, told across active and passive voice: "did Rome defeat
    Carthage" against "was Rome defeated by Carthage" exchange the roles (returns the two
    words), "Carthage was defeated by Rome" keeps them (None)."""
    for active, passive in ((a, b), (b, a)):
        roles_p = _passive(passive)
        if roles_p is None:
            continue
        verb, patient, agent = roles_p
        roles_a = _active(active, verb)
        if roles_a is None:
            continue
        subject, obj = roles_a
        if {subject, obj} == {patient, agent} and (subject, obj) != (agent, patient):
            return subject, obj
    return None


def _passive(p: Parsed) -> tuple[str, str, str] | None:
    """(verb, patient, agent) of "PATIENT be VERBed by AGENT", if the prompt has one: the
    verb is the content word right before "by" (a word that is no content, or an adverb in
    -ly, may stand between), with a form of "be" at most four words before it; the patient is
    the content word before that, an adverb passed over ("was Rome quickly conquered")."""
    toks = p.tokens
    content = set(p.content)
    for j, t in enumerate(toks):
        if t != "by":
            continue
        i = j - 1 if toks[j - 1] in content and not adverb(toks[j - 1]) else j - 2
        # a patient and a form of "be" stand before the verb: two words at least
        if i < 2 or toks[i] not in content or not any(x in BE_FORMS for x in toks[i - 4 if i > 4 else 0 : i]):
            continue
        agent = next((x for x in toks[j + 1 :] if x in content), None)
        patient = _patient(toks[:i], content)
        if agent and patient:
            return _verb(toks[i]), patient, agent
    return None


def _patient(before: tuple[str, ...], content: set[str]) -> str | None:
    """The last content word before a verb (a passive's patient, an active's subject); a word
    in -ly is passed over only where a content word stands before it, the role it follows ("was
    the city quickly invaded", "Italy was quickly conquered", "did Rome quickly conquer"): "was
    Italy conquered", "was the family helped" name the patient in -ly."""
    for k in range(len(before) - 1, -1, -1):
        x = before[k]
        if x in content and not (adverb(x) and any(w in content for w in before[:k])):
            return x
    return None


def _active(p: Parsed, verb: str) -> tuple[str, str] | None:
    """(subject, object) either side of ``verb`` in a clause without "by": the subject found
    as ``_patient`` finds a passive's patient (an adverb in -ly after it passed over), the
    object the next content word."""
    if "by" in p.tokens:
        return None
    content = [t for t in p.tokens if t in p.content]
    for i, t in enumerate(content):
        if _verb(t) == verb and 0 < i < len(content) - 1:
            subject = _patient(tuple(content[:i]), set(content))
            return (subject, content[i + 1]) if subject is not None else None
    return None


def _attached(p: Parsed) -> dict[str, set[tuple[str, str]]]:
    """Each content word that is the object of a directional word -> the (head, directional
    word) pairs it hangs from: in "born in Paris and moved to London", "paris" hangs from
    ("born", "in") and "london" from ("move", "to")."""
    out: dict[str, set[tuple[str, str]]] = {}
    sk, content = p.skeleton, set(p.content)
    for i in range(1, len(sk) - 1):
        h, d, o = sk[i - 1], sk[i], sk[i + 1]
        # a head that is itself the object of a directional word ("to Paris from London")
        # is a chain of phrases, whose order says nothing of roles
        if (
            d not in content
            and h in content
            and o in content
            and h not in FRAMING_READ | EXPOSITION
            and not (i >= 2 and sk[i - 2] not in content)
        ):
            out.setdefault(o, set()).add((h, d))
    return out


def roles_changed(a: Parsed, b: Parsed) -> tuple[str, str, str] | None:
    """A word both prompts share that hangs from another shared word in each (through a
    directional word), and from different ones: (word, its head in a, its head in b). "born
    in Paris and moved to London" / "born in London and moved to Paris": "paris" is where one
    was born in the first and where one moved in the second. A phrase moved whole keeps its
    head ("for a dog with a sensitive stomach" fronted), and a word with no head on one side
    (a subject, a fronted phrase) says nothing."""
    shared = set(a.content) & set(b.content)
    at_a, at_b = _attached(a), _attached(b)
    for o in sorted(shared):
        ha = {x for x in at_a.get(o, ()) if x[0] in shared}
        hb = {x for x in at_b.get(o, ()) if x[0] in shared}
        if ha and hb and ha.isdisjoint(hb):
            # the same head reached another way ("used to X" / "uses X") is no change of role
            if {h for h, _ in ha} & {h for h, _ in hb}:
                continue
            return o, " ".join(sorted(" ".join(x) for x in ha)), " ".join(sorted(" ".join(x) for x in hb))
    return None
