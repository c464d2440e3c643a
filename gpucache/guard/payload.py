"""A prompt's payload and its symbols: the parts a rewording keeps verbatim.

Many prompts are an instruction over a payload: "Summarize: '...'", "Explain this code:
`...`", "Translate into French: \"...\"". Two users asking for the same thing word the
instruction differently and paste the same payload; two different requests often share the
instruction and differ inside the payload by one word ("Monday" / "Tuesday", `x > 0` / `x < 0`),
which a sentence embedding barely sees. So the payload is compared apart from the
instruction: payloads must match (case and whitespace aside), and the instructions are
compared by the usual rules with the payload, and the nouns that only point at it ("this
sentence", "this code"), set aside.

Symbols and operators (``<``, ``>=``, ``==``, ``+``, ``-``, ``*``, ``/``, ``//``, ``^``, ``|``,
``&&``...) are content: ``x >= 5`` and ``x <= 5`` ask different things, and a tokenizer for
words drops them. Where both prompts hold operators, their sequences must match.

Pure functions of the strings (regular expressions, no floating point), like the rest of the
guard.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpucache.guard.memo import reader_memo

# Quoted or code text: `code`, "double" or 'single' quotes opened at a word boundary (after a
# space, a colon or a bracket, or at the start) and closed before a space, punctuation or the
# end, so the apostrophe of "don't" never opens one. Curly quotes are read as straight ones.
_CODE = re.compile(r"(?<!`)`([^`]+)`(?!`)")  # ``doubled'' backticks are typeset quotes, not code
_QUOTED = re.compile(r"""(?:^|(?<=[\s:(\[]))(["'])(?!\1)(.+?)(?<!\1)\1(?=$|[\s.,;:!?)\]])""", re.DOTALL)
_CURLY = str.maketrans({"“": '"', "”": '"', "‘": "'", "’": "'"})
# Operators, longest first; a one-character one counts only where it is not inside a word
# ("km/h", "R&D", "well-known" are words) and "-" only where it stands apart ("x - 5", "-4").
_OPERATORS = re.compile(
    r"==|!=|<=|>=|=>|->|<<|>>|//|\*\*|&&|\|\||"
    r"(?<![A-Za-z])[<>=+*/^|&%](?![A-Za-z])|"
    r"(?:(?<=\s)|^)-(?=[\s\d(])"
)
# Nouns that only point at the payload, after "this" or "these" ("this sentence", "this
# code"): with the payload set aside they add nothing to the instruction. Only after a
# demonstrative: "count the words in ..." counts words, and keeps them.
PAYLOAD_NOUNS = (
    "sentences? texts? code lines? snippets? paragraphs? passages? emails? messages? reviews? "
    "phrases? quotes? statements? query queries functions? strings? excerpts?"
)
_POINTING = re.compile(rf"\b(this|these)\s+(?:{'|'.join(PAYLOAD_NOUNS.split())})\b", re.IGNORECASE)
_OR_NOT = re.compile(r"\s+or\s+not\b(?=\s*(?:[:?.!,'\"`]|$))")
MIN_PAYLOAD_CHARS = 3


@dataclass(frozen=True)
class Split:
    """A prompt read as an instruction and its payloads (in order, normalised)."""

    instruction: str  # without its payloads, the nouns pointing at them, a closing "or not"
    payloads: tuple[str, ...]
    plain: str  # the whole prompt, without a closing "or not"


def _normal(text: str) -> str:
    return " ".join(text.casefold().split())


@reader_memo(4096)
def split(prompt: str) -> Split:
    """The prompt's payloads (code spans, then quoted text, each of at least
    ``MIN_PAYLOAD_CHARS`` characters) and the instruction left when they, the nouns that point
    at them, and a closing "or not" are taken out."""
    text = prompt.translate(_CURLY)
    found: list[tuple[int, str]] = []

    def keep(match: re.Match[str], group: int) -> str:
        inner = match.group(group)
        if len(inner.strip()) < MIN_PAYLOAD_CHARS:
            return match.group(0)
        found.append((match.start(), _normal(inner)))
        return " "

    plain = _OR_NOT.sub("", text)
    text = _CODE.sub(lambda m: keep(m, 1), text)
    text = _QUOTED.sub(lambda m: keep(m, 2), text)
    if not found:
        return Split(plain, (), plain)
    instruction = _OR_NOT.sub("", _POINTING.sub(r"\1", text))
    return Split(instruction, tuple(p for _, p in found), plain)


@reader_memo(4096)
def operators(prompt: str) -> tuple[str, ...]:
    """The operators and symbols of a prompt, in order."""
    return tuple(_OPERATORS.findall(prompt.translate(_CURLY)))


_BRACKETS = re.compile(r"[()\[\]{}]")


@reader_memo(4096)
def grouping(prompt: str) -> tuple[str, ...]:
    """The brackets of a prompt, in order: beside operators they group ("2 + 3 * 4" /
    "(2 + 3) * 4") or slice ("y = x" / "y = x[:]"), so the symbols rule compares them too."""
    return tuple(_BRACKETS.findall(prompt))


# This module's memos, which ``lexical.clear_caches`` empties.
MEMOS = (split, operators, grouping)
