"""Checks on what callers hand the cache, run before any state changes.

Every public entry point validates all of its input first, so a rejected call leaves the cache
exactly as it was. Messages name the allowed values. These are real checks, not asserts:
``python -O`` strips asserts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from gpucache.cache.served import Keep, LoaderAnswer, ServeOnly
from gpucache.conversation.value import MARK, Conversation
from gpucache.keys import DEFAULT_SCOPE


def check_prompt(prompt: object, what: str = "prompt") -> str:
    """A prompt as the cache keys it: a str as given, a ``Conversation`` as its key."""
    if isinstance(prompt, Conversation):
        check_prompt(prompt.request, f"{what}.request")
        return prompt.key
    if not isinstance(prompt, str):
        raise TypeError(f"{what} must be a str or a Conversation, got {type(prompt).__name__}")
    if not prompt.strip():
        raise ValueError(f"{what} must not be empty or whitespace only")
    if prompt.startswith(MARK):  # a key only Conversation.key writes: never a caller's text
        raise ValueError(
            f"{what} must not start with a NUL character followed by gpucache's conversation marker"
        )
    return prompt


def check_prompts(prompts: object) -> list[str]:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Iterable):
        raise TypeError(f"prompts must be a list of str, got {type(prompts).__name__}")
    return [check_prompt(prompt, f"prompts[{i}]") for i, prompt in enumerate(prompts)]


def check_response(response: object, what: str = "response") -> str:
    if not isinstance(response, str):
        raise TypeError(f"{what} must be a str, got {type(response).__name__}")
    return response


def check_scope(scope: object) -> str:
    if scope is None:
        return DEFAULT_SCOPE
    if not isinstance(scope, str):
        raise TypeError(f"scope must be a str or None, got {type(scope).__name__}")
    return scope


def check_threshold(threshold: object) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise TypeError(f"threshold must be a float in (0, 1], got {type(threshold).__name__}")
    if not 0.0 < float(threshold) <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    return float(threshold)


# The longest lifetime an entry may be given: ten years. Nobody means more, and past about
# 1e16 seconds an expiry no longer fits Redis's millisecond timestamps (PEXPIREAT fails), so
# one such entry would stop replication for every entry after it.
MAX_TTL_SECONDS = 10 * 365 * 86400


def check_ttl(ttl: object, what: str = "ttl") -> float | None:
    """Seconds an entry lives; None means until evicted."""
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise TypeError(f"{what} must be a positive number of seconds or None, got {ttl!r}")
    if not (float(ttl) > 0.0 and math.isfinite(float(ttl))):
        raise ValueError(f"{what} must be a positive finite number of seconds or None, got {ttl!r}")
    if float(ttl) > MAX_TTL_SECONDS:
        raise ValueError(
            f"{what} must be at most {MAX_TTL_SECONDS} seconds (ten years; None: until evicted), got {ttl!r}"
        )
    return float(ttl)


def check_positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int >= 1, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{what} must be an int >= 1, got {value!r}")
    return value


def check_flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{what} must be a bool, got {type(value).__name__}")
    return value


def check_loaded(response: object) -> Keep[str]:
    """A text loader's one answer (the ``get_or_put`` family): a str, kept and served."""
    return Keep(check_response(response, "loader's response"))


def check_answer(answer: object, what: str = "loader's answer") -> LoaderAnswer[Any]:
    """A typed loader's answer (the ``get_or_load`` family): ``Keep(text, value)`` with a str
    text, or ``ServeOnly(value)``."""
    if isinstance(answer, ServeOnly):
        return answer
    if isinstance(answer, Keep):
        check_response(answer.text, f"{what}'s text")
        check_ttl(answer.ttl, f"{what}'s ttl")
        return answer
    raise TypeError(f"{what} must be Keep(text, value) or ServeOnly(value), got {type(answer).__name__}")


def check_loader(loader: object, shape: str) -> None:
    if not callable(loader):
        raise TypeError(f"loader must be callable: {shape}")


def check_batch(responses: object, expected: int) -> list[Keep[str]]:
    """A batch loader's answer: a list of ``expected`` str, or a clear error."""
    if isinstance(responses, (str, bytes)) or not isinstance(responses, Iterable):
        raise TypeError(f"loader must return a list of str, got {type(responses).__name__}")
    responses = list(responses)
    if len(responses) != expected:
        raise ValueError(f"loader returned {len(responses)} responses for {expected} prompts")
    return [Keep(check_response(r, f"loader's response [{i}]")) for i, r in enumerate(responses)]
