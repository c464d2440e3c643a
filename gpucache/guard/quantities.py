"""The same amount written in other units: "2 minutes" / "120 seconds", "1000 mg" / "1 g",
"half an hour" / "30 minutes", "2pm" / "14:00".

Why: the numbers rule compares numbers by value, so the same duration, mass, length or volume
written in another unit looks like another number and a rewording is refused. Where the
numbers of two prompts differ, the guard (lexical.py) reads both again with every amount of a
metric or time unit written in one unit per quantity (``canonical``: seconds, grams, metres,
millilitres; times of day on the 24-hour clock), and keeps that reading only where the numbers
then agree. So an amount that differs still differs ("2 km" / "3 km" is "2000 metres" /
"3000 metres"), units without an exact metric ratio are left as written ("miles", "pounds",
"cups"), and a pair this never rescues is judged exactly as before.

Exact: every factor is a ``Fraction`` and every value is written from one, so the reading is the
same on every machine; no floating point.
"""

from __future__ import annotations

import re
from fractions import Fraction

from gpucache.guard.words import NUMBER_WORDS

# unit -> (the unit written for the quantity, how many of it one makes)
_UNITS: dict[str, tuple[str, Fraction]] = {}
for _names, _base, _factor in (
    ("sec secs second seconds", "seconds", Fraction(1)),  # not "s": "the 1960s"
    ("min mins minute minutes", "seconds", Fraction(60)),
    ("h hr hrs hour hours", "seconds", Fraction(3600)),
    ("day days", "seconds", Fraction(86400)),
    ("week weeks", "seconds", Fraction(604800)),
    ("mg milligram milligrams", "grams", Fraction(1, 1000)),
    ("g gram grams", "grams", Fraction(1)),
    ("kg kilo kilos kilogram kilograms", "grams", Fraction(1000)),
    ("mm millimetre millimetres millimeter millimeters", "metres", Fraction(1, 1000)),
    ("cm centimetre centimetres centimeter centimeters", "metres", Fraction(1, 100)),
    ("metre metres meter meters", "metres", Fraction(1)),
    ("km kilometre kilometres kilometer kilometers", "metres", Fraction(1000)),
    ("ml millilitre millilitres milliliter milliliters", "millilitres", Fraction(1)),
    ("cl", "millilitres", Fraction(10)),
    ("dl", "millilitres", Fraction(100)),
    ("l litre litres liter liters", "millilitres", Fraction(1000)),
):
    for _name in _names.split():
        _UNITS[_name] = (_base, _factor)

# an amount: digits ("2", "1.5", "1,000"), a number word ("two", "a dozen"), or "a"/"an"; a
# fraction of one ("half an", "a quarter of an") before it
_WORDS = "|".join(sorted((w for w in NUMBER_WORDS if NUMBER_WORDS[w][0].isdigit()), key=len, reverse=True))
_AMOUNT = re.compile(
    r"(?<![\w.,:/])(?:(?P<part>half(?: of)?|(?:a |one )?quarter of|(?:a |one )?third of) (?:an?|one) "
    r"|(?P<digits>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?) ?-?"
    r"|(?P<word>" + _WORDS + r"|an?)[ -])"
    r"(?P<unit>" + "|".join(sorted(map(re.escape, _UNITS), key=len, reverse=True)) + r")\b(?![.,]\d)",
    re.IGNORECASE,
)
_PARTS = {"half": Fraction(1, 2), "quarter": Fraction(1, 4), "third": Fraction(1, 3)}
_CLOCK = re.compile(r"(?<![\w.:])(\d{1,2})(?::([0-5]\d))? ?([ap])\.?m\.?(?!\w)", re.IGNORECASE)
_NAMED_TIMES = re.compile(r"\b(?:noon|midday|midnight)\b", re.IGNORECASE)


def _written(value: Fraction) -> str:
    """A value as a plain decimal where it is one, else as a fraction ("1/3")."""
    if value.denominator == 1:
        return str(value.numerator)
    d = value.denominator
    while d % 2 == 0:
        d //= 2
    while d % 5 == 0:
        d //= 5
    if d != 1:
        return f"{value.numerator}/{value.denominator}"
    places = 0
    while (value * 10**places).denominator != 1:
        places += 1
    whole = value * 10**places
    text = str(whole.numerator).rjust(places + 1, "0")
    return f"{text[:-places]}.{text[-places:]}"


def _amount(m: re.Match[str]) -> str:
    base, factor = _UNITS[m["unit"].lower()]
    if m["part"] is not None:
        value = _PARTS[m["part"].split()[-2 if m["part"].endswith("of") else 0].lower()]
    elif m["digits"] is not None:
        value = Fraction(m["digits"].replace(",", ""))
    else:
        word = m["word"].lower()
        value = Fraction(1) if word in ("a", "an") else Fraction(NUMBER_WORDS[word])
    return f"{_written(value * factor)} {base}"


def _clock(m: re.Match[str]) -> str:
    hour, minute = int(m[1]), int(m[2] or 0)
    if not 1 <= hour <= 12:
        return m[0]
    hour = hour % 12 + (12 if m[3].lower() == "p" else 0)
    return f"{hour:02d}:{minute:02d}"


def canonical(text: str) -> str:
    """``text`` with every amount of a metric or time unit in one unit per quantity, and every
    time of day on the 24-hour clock ("2pm", "noon": "14:00", "12:00")."""
    text = _AMOUNT.sub(_amount, text)
    text = _CLOCK.sub(_clock, text)
    return _NAMED_TIMES.sub(lambda m: "00:00" if m[0].lower() == "midnight" else "12:00", text)
