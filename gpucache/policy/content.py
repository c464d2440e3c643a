"""CachePolicy: may this answer be stored at all?

A promise about what must never be persisted, so it covers every write path: ``put``,
``warm``, ``get_or_put``, ``get_or_put_all``, ``get_or_put_streaming`` and the async forms. (The
admission policy is the opposite: an optimisation about what is worth storing, applied only to
the writes that follow a miss.) A refused answer is still returned to whoever asked; it is just
not kept, so it is never replayed to anyone else.

``ContentPolicy`` is the default. Its rules, each with its reason string for ``stats()``:

    empty-response     the response is empty or whitespace
    too-large          the response is longer than ``max_response_chars``, or the prompt than
                       ``max_prompt_chars`` (past the patterns' scan a secret could hide, and
                       one multi-megabyte prompt would hold what thousands of questions do)
    error-response     the response matches an error/refusal pattern: a model's "I'm sorry, I
                       can't" or an upstream "rate limit exceeded" must not be served to others
    secret             prompt or response carries a credential: private key blocks, AWS, GitHub,
                       Slack, Google and OpenAI-style keys, JWTs, bearer tokens
    personal-data      prompt or response carries an email address, a phone number, or a
                       payment card number that passes the Luhn check

Pattern checks are regular expressions over the text, bounded in cost by ``max_scan_chars``
and linear in it on any input: ``re`` holds the GIL for a whole search, so a pattern that
backtracks quadratically lets one prompt stop every request in the process. An unbounded run
that a match may fail after (an address's local part, a JWT's segments) starts only where the
run starts and is taken whole (``_whole``), and every other run is bounded or ends the match;
``bench/policy_cost.py`` measures ``decide`` on text written to backtrack. A long text is
scanned in overlapping pieces (``pieces``), so no one search holds the GIL for more than a
piece: a 190 KB conversation scanned whole held it about 70 ms at a time, and every other
tenant's exact hits on the event loop waited that long.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class PolicyDecision:
    """Whether an answer may be stored, and the rule that said no."""

    allowed: bool
    reason: str = "allowed"


ALLOWED = PolicyDecision(True)


@runtime_checkable
class CachePolicy(Protocol):
    """Decides from content alone whether (prompt, response) may be stored."""

    name: str

    def decide(self, prompt: str, response: str, scope: str) -> PolicyDecision: ...


class StoreEverything:
    """A policy that allows every write (for caches of trusted, synthetic content)."""

    name = "store-everything"

    def decide(self, prompt: str, response: str, scope: str) -> PolicyDecision:
        return ALLOWED


DEFAULT_ERROR_PATTERNS: tuple[str, ...] = (
    r"^\s*(?:i'?m sorry|i am sorry|sorry, (?:but )?i (?:can(?:no|')t|am unable))",
    r"^\s*(?:i can(?:no|')t|i am unable to|i'm unable to) (?:help|assist|comply|do that|answer)",
    r"^\s*as an ai(?: language model)?,? i",
    r"\b(?:rate limit(?:ed)? exceeded|too many requests|internal server error|"
    r"service unavailable|bad gateway|gateway time-?out|context length exceeded)\b",
    r"^\s*(?:error|exception|traceback \(most recent call last\))\s*[:\-]",
)


def _whole(chars: str, least: int, name: str) -> str:
    """A run of at least ``least`` of ``chars`` (a character class's inside), taken whole: an
    atomic group, written as a lookahead that captures the run and a backreference that
    consumes it, since Python before 3.11 has no ``(?>...)``. The engine never backtracks into
    the run, so a failed match costs the run's length once, not once per shorter prefix."""
    return f"(?=(?P<{name}>[{chars}]{{{least},}}))(?P={name})"


# The characters of an e-mail address's local part, and of a base64url segment
_LOCAL = "A-Za-z0-9._%+\\-"
_B64 = "A-Za-z0-9_\\-"
# Each credential pattern with the literal strings one of which every match holds (lowercase:
# looked for in the text lowercased). A pattern runs only on a text holding one: most texts hold
# none, and a search that starts with ``\b`` or a lookbehind tries every position of the text
# (a few milliseconds per 190 KB each, with the GIL held), where a substring test does not.
_SECRET_RULES: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = tuple(
    (re.compile(p), needles)
    for p, needles in (
        (r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----", ("-----begin",)),
        (r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", ("akia", "asia")),  # AWS access key id
        (r"\bgh[pousr]_[A-Za-z0-9]{36,}\b", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),  # GitHub tokens
        (r"\bgithub_pat_[A-Za-z0-9_]{22,}\b", ("github_pat_",)),
        (r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b", ("xox",)),  # Slack
        (r"\bAIza[0-9A-Za-z_\-]{35}\b", ("aiza",)),  # Google API key
        (r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{20,}\b", ("sk-",)),  # OpenAI / Anthropic style
        # JWT: three base64url segments, the first two a JSON object's '{"' (eyJ)
        (
            rf"(?<![{_B64}])eyJ{_whole(_B64, 8, 'header')}\.eyJ{_whole(_B64, 8, 'claims')}\.[{_B64}]{{8,}}",
            ("eyj",),
        ),
        (r"(?i)\bbearer\s+[A-Za-z0-9_\-.=]{20,}", ("bearer",)),
        (
            r"(?i)\b(?:api[_-]?key|secret|password|passwd|token)\s*[:=]\s*['\"]?[^\s'\"]{8,}",
            ("api", "secret", "passw", "token"),
        ),
    )
)


def _has_secret(text: str) -> bool:
    lowered = text.lower()
    return any(any(n in lowered for n in needles) and p.search(text) for p, needles in _SECRET_RULES)


_EMAIL = re.compile(rf"(?<![{_LOCAL}]){_whole(_LOCAL, 1, 'local')}@[A-Za-z0-9.\-]+\.[A-Za-z]{{2,}}\b")
# +country code or (area code) forms, 9 to 15 digits with the usual separators
_PHONE = re.compile(
    r"(?<![\w.])(?:\+\d{1,3}[\s.\-]?)?(?:\(\d{2,4}\)[\s.\-]?)?\d{2,4}(?:[\s.\-]\d{2,4}){1,4}(?!\w|\.\d)"
    r"|(?<![\w.])\+\d{9,15}(?!\w|\.\d)"
)
_CARD = re.compile(r"(?<!\d)(?:\d[ \-]?){12,18}\d(?!\d)")
# What every phone or card number above holds: nine digits, at most two of the separators they
# allow between two of them. Most texts hold none, and this search is a scan for a digit.
_NINE_DIGITS = re.compile(r"\d(?:[\s.\-()]{0,2}\d){8}")


# Pieces a long text is scanned in, and by how much each overlaps the next: a match of up to
# SCAN_OVERLAP characters lies whole in one piece (the credentials, numbers and addresses the
# patterns find are far shorter; a longer run, "[^\s]{8,}", holds a short match too). A piece
# that starts inside a word may match where the whole text would not: a refusal more, never one
# fewer.
SCAN_PIECE, SCAN_OVERLAP = 8192, 1024


def pieces(text: str) -> tuple[str, ...]:
    """``text`` as overlapping pieces of at most SCAN_PIECE characters (module doc)."""
    if len(text) <= SCAN_PIECE:
        return (text,)
    step = SCAN_PIECE - SCAN_OVERLAP
    return tuple(text[i : i + SCAN_PIECE] for i in range(0, len(text) - SCAN_OVERLAP, step))


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum every payment card number passes."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _has_card(text: str) -> bool:
    for match in _CARD.finditer(text):
        digits = re.sub(r"\D", "", match.group(0))
        if luhn_valid(digits):  # 13 to 19 digits: the pattern takes no more and no fewer
            return True
    return False


def _has_phone(text: str) -> bool:
    for match in _PHONE.finditer(text):
        digits = re.sub(r"\D", "", match.group(0))
        if 9 <= len(digits) <= 15 and not _GROUPED_NUMBER.fullmatch(match.group(0)):
            return True
    return False


# "1.000.000.000" and "10 000 000" are numbers written in groups of thousands, not phone
# numbers (a date has eight digits, too few to be one)
_GROUPED_NUMBER = re.compile(r"\d{1,3}(?:[ .,]\d{3})+")


class ContentPolicy:
    """The default ``CachePolicy``: refuse empty, oversized, error and sensitive answers.

    Args:
        max_response_chars: longest response stored (characters).
        max_prompt_chars: longest prompt stored (characters; at most ``max_scan_chars``, so
            every stored prompt is scanned whole).
        error_patterns: case-insensitive regular expressions; a response matching any is an
            error or refusal and is not stored. Defaults to ``DEFAULT_ERROR_PATTERNS``.
        refuse_secrets: refuse prompts or responses carrying credentials.
        refuse_personal_data: refuse prompts or responses carrying emails, phone numbers or
            Luhn-valid card numbers.
        max_scan_chars: characters of each text scanned by the patterns (bounds the cost).
    """

    name = "content"

    def __init__(
        self,
        *,
        max_response_chars: int = 200_000,
        max_prompt_chars: int = 200_000,
        error_patterns: Iterable[str] | None = None,
        refuse_secrets: bool = True,
        refuse_personal_data: bool = True,
        max_scan_chars: int = 200_000,
    ) -> None:
        if (
            isinstance(max_response_chars, bool)
            or not isinstance(max_response_chars, int)
            or (max_response_chars < 1)
        ):
            raise ValueError(f"max_response_chars must be an int >= 1, got {max_response_chars!r}")
        if isinstance(max_scan_chars, bool) or not isinstance(max_scan_chars, int) or (max_scan_chars < 1):
            raise ValueError(f"max_scan_chars must be an int >= 1, got {max_scan_chars!r}")
        if (
            isinstance(max_prompt_chars, bool)
            or not isinstance(max_prompt_chars, int)
            or not (1 <= max_prompt_chars <= max_scan_chars)
        ):
            raise ValueError(
                f"max_prompt_chars must be an int in 1..max_scan_chars, got {max_prompt_chars!r}"
            )
        patterns = DEFAULT_ERROR_PATTERNS if error_patterns is None else tuple(error_patterns)
        try:
            self._errors = [re.compile(p, re.IGNORECASE) for p in patterns]
        except re.error as exc:
            raise ValueError(f"error_patterns holds an invalid regular expression: {exc}") from exc
        self.max_response_chars = max_response_chars
        self.max_prompt_chars = max_prompt_chars
        self.error_patterns = patterns
        self.refuse_secrets = refuse_secrets
        self.refuse_personal_data = refuse_personal_data
        self.max_scan_chars = max_scan_chars

    def decide(self, prompt: str, response: str, scope: str) -> PolicyDecision:
        if not response.strip():
            return PolicyDecision(False, "empty-response")
        if len(response) > self.max_response_chars or len(prompt) > self.max_prompt_chars:
            return PolicyDecision(False, "too-large")
        head = pieces(response[: self.max_scan_chars])
        if any(p.search(t) for p in self._errors for t in head):
            return PolicyDecision(False, "error-response")
        texts = (*pieces(prompt[: self.max_scan_chars]), *head)
        if self.refuse_secrets and any(_has_secret(t) for t in texts):
            return PolicyDecision(False, "secret")
        if self.refuse_personal_data and any(
            ("@" in t and _EMAIL.search(t)) or (_NINE_DIGITS.search(t) and (_has_card(t) or _has_phone(t)))
            for t in texts
        ):
            return PolicyDecision(False, "personal-data")
        return ALLOWED
