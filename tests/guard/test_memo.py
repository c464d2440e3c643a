"""The guard's memos are each reader's own (gpucache/guard/memo.py): what one scope's prompts
made the guard read never makes another scope's reading faster, so a tenant cannot time the
guard to learn what another tenant asked."""

from __future__ import annotations

from gpucache.guard import request
from gpucache.guard.memo import ReaderMemo, current_reader, reading_for


def test_a_memo_kept_under_one_reader_is_not_found_under_another():
    calls: list[str] = []

    def read(text: str) -> str:
        calls.append(f"{current_reader()}:{text}")
        return text.upper()

    memo = ReaderMemo(read, maxsize=16)
    with reading_for("tenant-a"):
        assert memo("rare words") == "RARE WORDS"
        assert memo("rare words") == "RARE WORDS"  # a's own memo: read once
    with reading_for("tenant-b"):
        assert memo("rare words") == "RARE WORDS"  # b reads it again: a's reading is not b's
    assert memo("rare words") == "RARE WORDS"  # outside any reader: the library's own memo
    assert calls == ["tenant-a:rare words", "tenant-b:rare words", ":rare words"]
    assert current_reader() == ""  # the block's reader is gone with the block
    memo.cache_clear()
    assert memo.cache_info().currsize == 0


def test_the_guards_text_and_word_memos_are_reader_memos():
    """Every memo the guard clears between readings (lexical.MEMOS) is kept per reader; the
    dictionary, loaded once, is the one shared read."""
    from gpucache.guard.lexical import MEMOS

    assert MEMOS and all(isinstance(memo, ReaderMemo) for memo in MEMOS)


def test_a_cache_reads_a_prompt_again_for_another_scope(real_embedder):
    """One scope stores a prompt of rare and misspelled words: another scope asking the same
    prompt has it read for itself (a miss of the request memo), and its own second asking is
    read from its memo."""
    from gpucache import SemanticCache

    cache = SemanticCache(real_embedder, device="cpu")
    text = "Could you explane the quixotical recomendations of the comittee on zymurgy?"
    assert cache.put(text, "stored for a", scope="a")
    misses = request.request_memo.cache_info().misses
    assert cache.get(text, scope="b") is None  # nothing of a's is b's
    assert request.request_memo.cache_info().misses == misses + 1  # read anew for b
    assert cache.get(text, scope="b") is None
    assert request.request_memo.cache_info().misses == misses + 1  # b's own memo now
    assert cache.get(text, scope="a").response == "stored for a"  # an exact hit: no reading at all


def test_a_candidate_is_judged_with_the_scopes_own_memos(real_embedder):
    """The same stored prompt and the same question in two scopes: the second scope's judgment
    reads both anew (its parse memo misses), where a shared memo would have had them ready."""
    from gpucache import SemanticCache
    from gpucache.guard import parsing

    cache = SemanticCache(real_embedder, device="cpu")
    stored = "How do I reset the password of my router?"
    asked = "how can i reset my router's password"
    for scope in ("a", "b"):
        assert cache.put(stored, f"answer for {scope}", scope=scope)
    assert cache.get(asked, scope="a").response == "answer for a"
    misses = parsing.parse_memo.cache_info().misses
    assert cache.get(asked, scope="b").response == "answer for b"
    assert parsing.parse_memo.cache_info().misses > misses
