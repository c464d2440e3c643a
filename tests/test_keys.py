"""The key of an exact (scope, prompt) (gpucache/keys.py): the same in every process, and no two
(scope, prompt) pairs share one, whatever characters a scope holds."""

from __future__ import annotations

from conftest import outputs_under_hash_seeds

from gpucache.keys import prompt_key


def test_no_split_of_the_same_characters_shares_a_key():
    pairs = [("ab", "c"), ("a", "bc"), ("a/b", "c"), ("a", "b/c"), ("", "abc"), ("abc", "")]
    keys = [prompt_key(s, p) for s, p in pairs]
    assert len(set(keys)) == len(pairs) and all(len(k) == 16 for k in keys)


def test_a_lone_surrogate_gets_a_key_of_its_own():
    assert prompt_key("s", "a \ud800 b") != prompt_key("s", "a \ufffd b")


def test_the_key_is_the_same_in_every_process():
    code = "from gpucache.keys import prompt_key; print(prompt_key('tenant', 'What is 2 + 2?').hex())"
    assert len(outputs_under_hash_seeds(code)) == 1
