"""An exchange's Cache-Control (gpucache/serve/exchange.py), as HTTP means it."""

from __future__ import annotations

from gpucache.cache.served import Hit
from gpucache.serve.exchange import MAX_DELTA_SECONDS, CacheControl
from gpucache.serve.tenancy import Refusal


def hit(age: float) -> Hit:
    return Hit("an answer", "a prompt", 1.0, exact=True, age=age)


def test_max_age_is_the_age_a_request_accepts_not_a_lifetime():
    control = CacheControl.parse("max-age=60")
    assert control == CacheControl(max_age=60) and control.reads and not control.no_store
    assert control.fresh(hit(59.5)) and control.fresh(hit(60)) and not control.fresh(hit(60.5))
    assert not control.fresh(hit(float("inf")))  # an answer of unknown age is never fresh
    assert CacheControl().fresh(hit(float("inf")))  # no max-age: any age


def test_no_cache_and_max_age_zero_read_nothing_and_no_store_stores_nothing():
    assert not CacheControl.parse("no-cache").reads
    assert not CacheControl.parse("max-age=0").reads
    both = CacheControl.parse("No-Store, no-cache")
    assert both.no_store and not both.reads


def test_a_huge_max_age_is_capped_as_rfc_9111_says_and_a_malformed_one_is_a_400():
    assert CacheControl.parse("max-age=10000000000000000").max_age == MAX_DELTA_SECONDS
    assert CacheControl.parse("max-age=" + "9" * 10_000).max_age == MAX_DELTA_SECONDS  # past int()'s digits
    assert CacheControl.parse("max-age=" + "0" * 5_000 + "7").max_age == 7  # leading zeros are zeros
    for bad in ("max-age=-1", "max-age=1.5", 'max-age="5"', "max-age=", "max-age=١٢"):
        refused = CacheControl.parse(bad)
        assert isinstance(refused, Refusal) and refused.status == 400, bad
    assert CacheControl.parse("private, must-revalidate") == CacheControl()  # unknown: ignored


def test_the_upstreams_lifetime_is_s_maxage_then_max_age_less_its_age():
    from gpucache.serve.exchange import upstream_lifetime

    assert upstream_lifetime({"cache-control": "public, max-age=60"}) == 60
    assert upstream_lifetime({"cache-control": "max-age=60, s-maxage=10"}) == 10  # for shared caches
    assert upstream_lifetime({"cache-control": "max-age=60", "age": "15"}) == 45
    assert upstream_lifetime({"cache-control": "max-age=60", "age": "90"}) == 0
    assert upstream_lifetime({"cache-control": 'max-age="20"'}) == 20
    for says_nothing in ({}, {"cache-control": "public"}, {"cache-control": "max-age=soon"}, None):
        assert upstream_lifetime(says_nothing) is None
    assert upstream_lifetime({"cache-control": "max-age=" + "9" * 40}) == 2**31  # capped, no error


def test_an_answer_that_varies_on_a_request_header_is_not_kept():
    """Vary names request headers the answer depends on (RFC 9111 §4.1), which a cache keyed on
    the body cannot tell apart; Accept-Encoding aside (decoded text is the same for all)."""
    from gpucache.serve.exchange import upstream_allows_storing

    assert not upstream_allows_storing({"vary": "*"})
    assert not upstream_allows_storing({"vary": "Accept-Encoding, X-User-Tier"})
    assert upstream_allows_storing({"vary": "Accept-Encoding"}) and upstream_allows_storing({"vary": ""})
    # CORS varies its Access-Control-* headers by Origin, never the answer (vLLM sends it always)
    assert upstream_allows_storing({"vary": "Origin"}) and upstream_allows_storing(
        {"vary": "origin, accept-encoding"}
    )


def test_an_expires_in_the_past_or_malformed_is_not_kept_and_a_future_one_caps_the_life():
    """RFC 9111 §5.3: Expires, measured from the answer's Date, unless max-age or s-maxage says
    otherwise; a malformed one means already expired."""
    from gpucache.serve.exchange import upstream_allows_storing, upstream_lifetime

    date = "Thu, 03 Dec 2026 10:00:00 GMT"
    past = {"date": date, "expires": "Thu, 03 Dec 2026 09:00:00 GMT"}
    assert not upstream_allows_storing(past)
    assert not upstream_allows_storing({"date": date, "expires": "0"})  # malformed: expired
    future = {"date": date, "expires": "Thu, 03 Dec 2026 10:05:00 GMT"}
    assert upstream_allows_storing(future) and upstream_lifetime(future) == 300
    overridden = {**past, "cache-control": "max-age=60"}
    assert upstream_allows_storing(overridden) and upstream_lifetime(overridden) == 60
    assert upstream_allows_storing({**past, "cache-control": "s-maxage=30"})
