"""A credential's rate of requests (``rates.RateLimits``): a token bucket per holder, as plain
values on a clock the test moves. Through the real server: ``test_serve_overload.py``."""

from __future__ import annotations

import pytest

from gpucache.serve.rates import RateLimits


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_credential_sends_its_burst_at_once_and_then_its_rate():
    clock = Clock()
    limits = RateLimits(rate=2.0, burst=3, clock=clock)
    assert [limits.take("key:a") for _ in range(3)] == [None, None, None]
    assert limits.take("key:a") == 1  # half a second until a token: told one whole second
    clock.now += 0.5
    assert limits.take("key:a") is None  # one token back
    assert limits.take("key:a") == 1


def test_the_wait_it_is_told_is_the_time_until_its_next_token_rounded_up():
    clock = Clock()
    limits = RateLimits(rate=0.1, burst=1, clock=clock)
    assert limits.take("key:a") is None
    assert limits.take("key:a") == 10
    clock.now += 2.5
    assert limits.take("key:a") == 8  # 7.5 s left


def test_a_refused_request_takes_no_token():
    clock = Clock()
    limits = RateLimits(rate=1.0, burst=1, clock=clock)
    assert limits.take("key:a") is None
    assert [limits.take("key:a") for _ in range(5)] == [1] * 5
    clock.now += 1.0
    assert limits.take("key:a") is None  # the refusals did not push it further back


def test_one_credential_past_its_rate_leaves_the_others_theirs():
    limits = RateLimits(rate=1.0, burst=2, clock=Clock())
    assert [limits.take("key:a") for _ in range(3)] == [None, None, 1]
    assert [limits.take("key:b") for _ in range(2)] == [None, None]


def test_a_bucket_never_holds_more_than_its_burst():
    clock = Clock()
    limits = RateLimits(rate=1.0, burst=2, clock=clock)
    assert limits.take("key:a") is None
    clock.now += 3600
    assert [limits.take("key:a") for _ in range(3)] == [None, None, 1]


def test_buckets_that_have_refilled_are_forgotten():
    clock = Clock()
    limits = RateLimits(rate=1.0, burst=2, clock=clock)
    for n in range(100):  # many keys, each sending once
        assert limits.take(f"key:{n}") is None
    assert len(limits) == 100
    clock.now += 1.0  # each has its token back: full, as a new bucket is
    assert limits.take("key:new") is None
    assert len(limits) == 1
    clock.now += 0.5
    assert limits.take("key:new") is None  # a bucket not yet full is kept
    assert len(limits) == 1 and limits.take("key:new") == 1


@pytest.mark.parametrize("rate, burst", [(0.0, 1), (-1.0, 1), (1.0, 0)])
def test_a_rate_limit_needs_a_positive_rate_and_burst(rate, burst):
    with pytest.raises(ValueError, match="rate > 0 and burst >= 1"):
        RateLimits(rate, burst)
