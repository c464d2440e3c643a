"""ContentPolicy: what may never be stored, each rule with its reason."""

from __future__ import annotations

import pytest

from gpucache import ContentPolicy, PolicyDecision, StoreEverything
from gpucache.policy.content import DEFAULT_ERROR_PATTERNS, luhn_valid


def policy(**settings) -> ContentPolicy:
    """A policy made in the test that uses it: one made when the module is imported would be
    built before a test could see how (the mutation run found its defaults untested)."""
    return ContentPolicy(**settings)


@pytest.mark.parametrize(
    "prompt, response, reason",
    [
        ("q", "", "empty-response"),
        ("q", "   \n\t", "empty-response"),
        ("q", "x" * 200_001, "too-large"),
        ("x" * 200_001, "an answer", "too-large"),  # a prompt longer than the patterns scan
        ("q", "I'm sorry, but I can't help with that.", "error-response"),
        ("q", "I cannot assist with that request.", "error-response"),
        ("q", "As an AI language model, I do not have opinions.", "error-response"),
        ("q", "Error: upstream returned 502 Bad Gateway", "error-response"),
        ("q", "Rate limit exceeded, retry later", "error-response"),
        ("q", "Traceback (most recent call last):\n  File ...", "error-response"),
        ("q", "Use this key: AKIAIOSFODNN7EXAMPLE", "secret"),
        ("q", "token ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789", "secret"),
        ("q", "-----BEGIN RSA PRIVATE KEY-----\nMIIE...", "secret"),
        ("q", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N", "secret"),
        ("my api_key = sk-abcdefghijklmnopqrstuvwx, why does it fail?", "Check the key.", "secret"),
        ("q", "Authorization: Bearer abcdefghijklmnopqrstuvwxyz012345", "secret"),
        ("q", "Write to jane.doe@example.com for access.", "personal-data"),
        ("Email me at bob@example.org", "Sure.", "personal-data"),
        ("q", "Call +1 415 555 0132 tomorrow.", "personal-data"),
        ("q", "Her number is (020) 7946 0958.", "personal-data"),
        ("q", "Card 4111 1111 1111 1111 was charged.", "personal-data"),
        ("q", "Card 4111-1111-1111-1111 was charged.", "personal-data"),
    ],
)
def test_refuses_with_a_reason(prompt, response, reason):
    assert policy().decide(prompt, response, "default") == PolicyDecision(False, reason)


@pytest.mark.parametrize(
    "response",
    [
        "Paris is the capital of France.",
        "Use lst.reverse() or lst[::-1].",
        "The order number 4111 1111 1111 1112 fails the Luhn check, so it is no card.",
        "In 2024-01-15 the population was 1 000 000.",
        "Sorry to hear that! Here is how to reset your password: ...",
        "An error in your code: you forgot a colon.",
        "Version 3.11.7 was released on 2023-12-04.",
    ],
)
def test_allows_ordinary_answers(response):
    assert policy().decide("a question", response, "default").allowed, response


def test_rules_can_be_configured():
    lenient = ContentPolicy(
        max_response_chars=20, error_patterns=[r"^nope"], refuse_secrets=False, refuse_personal_data=False
    )
    assert lenient.decide("q", "x" * 21, "s").reason == "too-large"
    assert lenient.decide("q", "nope, not today", "s").reason == "error-response"
    assert lenient.decide("q", "I'm sorry", "s").allowed
    assert lenient.decide("q", "a@b.co", "s").allowed
    with pytest.raises(ValueError, match="regular expression"):
        ContentPolicy(error_patterns=["("])
    with pytest.raises(ValueError):
        ContentPolicy(max_response_chars=0)
    assert ContentPolicy(max_prompt_chars=10).decide("x" * 11, "fine", "s").reason == "too-large"
    with pytest.raises(ValueError, match="max_prompt_chars"):  # longer than the scan: unscanned text
        ContentPolicy(max_prompt_chars=300, max_scan_chars=200)


@pytest.mark.parametrize(
    "text",
    [
        "Card 4222222222222 was charged.",  # 13 digits, the fewest a card has
        "Card 1234567890123456785 was charged.",  # 19, the most
        "Card 5555555555554444 was charged.",  # a 5 doubled is 1 in the checksum
        "Call 12 345 6789 now.",  # 9 digits, the fewest a phone number has
        "Call +123 4567 8901 2345 now.",  # 15 digits, the most, longer than that with its spaces
    ],
)
def test_personal_data_at_the_edges_of_its_lengths_is_refused(text):
    assert policy().decide("q", text, "s").reason == "personal-data"


@pytest.mark.parametrize(
    "text",
    [
        "Call 1234 5678 now.",  # 8 digits: too few for a phone number
        "Call +1234 5678 9012 3456 now.",  # 16: too many
        "In 2024 the population was 1 000 000 000.",  # a number in groups of thousands
        "The budget rose to 1.000.000.000 euros.",
        "Reference 12345678901234567894 is on file.",  # 20 digits passing the checksum: no card is that long
    ],
)
def test_numbers_that_are_not_personal_data_are_allowed(text):
    assert policy().decide("q", text, "s").allowed


def test_the_defaults_refuse_secrets_and_personal_data_in_any_case_of_error():
    default = policy()
    assert default.refuse_secrets is True and default.refuse_personal_data is True
    assert default.decide("q", "ERROR: upstream down", "s").reason == "error-response"
    assert default.decide("q", "SERVICE UNAVAILABLE", "s").reason == "error-response"
    assert default.error_patterns == DEFAULT_ERROR_PATTERNS
    assert policy(error_patterns=["^nope"]).error_patterns == ("^nope",)


def test_the_limits_are_the_longest_text_stored_and_scanned():
    assert policy().decide("q", "x" * 200_000, "s").allowed  # the default limit, kept
    assert policy().decide("x" * 200_000, "fine", "s").allowed
    short = policy(max_response_chars=20, max_prompt_chars=10)
    assert short.decide("x" * 10, "y" * 20, "s").allowed
    assert (
        short.decide("x" * 11, "y" * 20, "s").reason == short.decide("x", "y" * 21, "s").reason == "too-large"
    )
    # a credential past the scan is not read: the scan bounds the cost, and a prompt is never
    # longer than the scan, so only a response longer than the scan holds text unread
    key = "AKIAIOSFODNN7EXAMPLE"
    wide = policy(max_response_chars=300_000)
    assert wide.decide("q", "x " * 99_990 + key, "s").reason == "secret"  # ends at character 200,000
    assert wide.decide("q", "x " * 99_990 + " " + key, "s").allowed  # ends one past it
    narrow = policy(max_scan_chars=50, max_prompt_chars=50)
    assert narrow.decide("q", "x " * 10 + key, "s").reason == "secret"
    assert narrow.decide("q", "x " * 30 + key, "s").allowed


@pytest.mark.parametrize("name", ["max_response_chars", "max_scan_chars", "max_prompt_chars"])
@pytest.mark.parametrize("value", [0, -1, True, 10.5, "10", None])
def test_a_limit_is_a_whole_number_of_at_least_one(name, value):
    with pytest.raises(ValueError, match=f"{name} must be an int"):
        ContentPolicy(**{name: value})


def test_a_limit_of_one_is_allowed():
    tiny = ContentPolicy(max_response_chars=1, max_scan_chars=1, max_prompt_chars=1)
    assert tiny.decide("q", "y", "s").allowed and tiny.decide("qq", "y", "s").reason == "too-large"


def test_luhn():
    assert luhn_valid("4111111111111111") and luhn_valid("79927398713")
    assert not luhn_valid("4111111111111112")


def test_store_everything_allows_all():
    assert StoreEverything().decide("q", "", "s").allowed


# Text a hostile client can send that made a pattern backtrack over the rest of the text from
# every start: address characters with no '@', a chain of JWT-looking runs, digits and dashes
# (bench/policy_cost.py measures these and more)
ADVERSARIAL = ["a.", "1-", "eyJ-", "eyJaaaaaaaa.eyJ-", "@a.", "a@"]


@pytest.mark.parametrize("unit", ADVERSARIAL)
def test_deciding_costs_in_proportion_to_the_text_on_adversarial_input(unit):
    """Python's ``re`` holds the GIL for a whole search, so a pattern that is quadratic on some
    input lets one prompt stop every other request (the e-mail pattern took seconds on 40,000
    characters of "a."). Not a speed target: the growth, in one run, from a text to one four
    times as long, which is 4x for a linear scan and 16x for a quadratic one
    (bench/policy_cost.py measures the times)."""
    small = (unit * 25_000)[:25_000] + "!"
    large = (unit * 100_000)[:100_000] + "!"
    from policy_cost import cost  # bench/policy_cost.py: the same measurement

    default = policy()
    growth = cost(default, large, 5) / cost(default, small, 5)
    assert growth < 8, f"{unit!r}: {growth:.1f}x the cost for 4x the text"


@pytest.mark.parametrize(
    "text",
    [
        "write to john.doe@example.com",
        "(bob_smith+tag@mail.example.org)",
        "--john@x.com",
        "a." * 1000 + "a@example.com",  # an address at the end of a long run of address characters
    ],
)
def test_an_address_anywhere_in_a_run_of_address_characters_is_found(text):
    assert policy().decide(text, "an answer", "default") == PolicyDecision(False, "personal-data")


@pytest.mark.parametrize(
    "text",
    [
        "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
        "the cookie (eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N)",
        "eyJ-" * 500 + " eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
    ],
)
def test_a_jwt_after_adversarial_text_is_still_found(text):
    assert policy().decide(text, "an answer", "default") == PolicyDecision(False, "secret")


SECRETS = [
    "-----BEGIN OPENSSH PRIVATE KEY-----",
    "AKIAIOSFODNN7EXAMPLE",
    "ASIAIOSFODNN7EXAMPLE",
    "gho_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
    "github_pat_11ABCDEFG0123456789_abcdefghij",
    "xoxb-1234567890-abcdefghij",
    "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    "sk-proj-abcdefghijklmnopqrstuvwx",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
    "BEARER abcdefghijklmnopqrstuvwxyz",
    "PassWord: hunter2hunter2",
    "API-KEY = 'abcdefgh12345678'",
]


@pytest.mark.parametrize("secret", SECRETS)
def test_every_credential_is_found_with_its_literal_first(secret):
    """A credential pattern runs only on a text holding one of its literal strings (the fast
    path); every form each pattern finds holds one, in any case the pattern takes."""
    from gpucache.policy import content

    assert any(p.search(secret) for p, _ in content._SECRET_RULES)
    assert content._has_secret(f"my setup: {secret} -- does it look right?")
    assert ContentPolicy().decide(f"is {secret} valid?", "Yes.", "s").reason == "secret"


@pytest.mark.parametrize("what, text", [("card", "4111 1111 1111 1111"), ("phone", "+1 (415) 555-2671")])
def test_a_number_across_two_scanned_pieces_is_found(what, text):
    """A long text is scanned in overlapping pieces (``pieces``): a number that straddles where
    one piece ends is whole in the next."""
    from gpucache.policy import content

    before = "word " * (content.SCAN_PIECE // 5)
    prompt = before[: content.SCAN_PIECE - len(text) // 2] + text + " and more words" * 2000
    assert len(prompt) > 2 * content.SCAN_PIECE
    assert ContentPolicy().decide(prompt, "Noted.", "s").reason == "personal-data", what
    assert all(len(piece) <= content.SCAN_PIECE for piece in content.pieces(prompt))
