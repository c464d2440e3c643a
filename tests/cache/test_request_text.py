"""The semantic tier embeds what a prompt asks (the verifier's ``request``), at store and at
lookup alike, with the real model: a misspelt or wrapped request lands on the stored one, and
the exact tier still keys the prompt as sent."""

from __future__ import annotations

from gpucache import LexicalNearMissVerifier, SemanticCache, ThresholdOnly


def test_a_misspelt_request_is_served_the_stored_answer(real_embedder):
    cache = SemanticCache(real_embedder, device="cpu")
    cache.put("How do I reset my password?", "Settings, then Security.")
    hit = cache.get("how do i resett my pasword")
    assert hit is not None and not hit.exact and hit.response == "Settings, then Security."
    assert hit.similarity > 0.95  # the prompts as typed score 0.62 with this model


def test_a_cache_that_reads_prompts_as_written_misses_it(real_embedder):
    """The same lookup through a verifier without a request reading: the raw texts are far
    apart, so the threshold alone refuses it; what the guard's reading buys."""
    cache = SemanticCache(real_embedder, device="cpu", verifier=ThresholdOnly())
    cache.put("How do I reset my password?", "Settings, then Security.")
    assert cache.get("how do i resett my pasword") is None


def test_greetings_and_thanks_are_not_what_is_embedded(real_embedder):
    cache = SemanticCache(real_embedder, device="cpu")
    assert cache._core.embedded(["hey there! quick question: how do I descale a kettle? thanks!"], [""]) == [
        "how do I descale a kettle?"
    ]
    cache.put("How do I descale a kettle?", "Vinegar and water.")
    hit = cache.get("hey there! quick question: how do I descale a kettle? thanks so much for your help!")
    assert hit is not None and hit.similarity > 0.99


def test_the_exact_tier_keys_the_prompt_as_sent(real_embedder):
    cache = SemanticCache(real_embedder, device="cpu", verifier=LexicalNearMissVerifier())
    cache.put("hey! how do I descale a kettle?", "Vinegar and water.")
    assert cache.get("hey! how do I descale a kettle?").exact
    assert not cache.get("how do I descale a kettle?").exact  # served, by meaning


def test_framing_segments_at_the_end_are_set_aside_as_those_at_the_start_are():
    """A sentence of thanks or hope after the question asks nothing (and one before it
    neither): the request is the question alone."""
    from gpucache.guard.request import strip_framing

    question = "How do I reset my password?"
    for framed in (
        f"{question} Any help would be appreciated.",
        f"{question} I hope you can help me. Thanks.",
        f"Hi there! {question} Thanks so much!",
    ):
        assert strip_framing(framed) == question, framed
