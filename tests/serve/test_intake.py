"""The budget of request-body bytes all requests hold at once (``intake.BodyBudget``): what it
takes, refuses and gives back, as plain values. Through the real server:
``test_serve_overload.py``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("starlette")
from gpucache.serve.intake import BodyBudget, OverBudget  # noqa: E402


def request():
    return SimpleNamespace(state=SimpleNamespace())


def test_a_budget_holds_what_requests_took_until_each_is_released():
    budget, a, b = BodyBudget(100), request(), request()
    budget.take(a, 60)
    budget.take(b, 30)
    budget.take(a, 10)
    assert budget.held == 100  # up to the limit, inclusive
    budget.release(a)
    assert budget.held == 30
    budget.release(b)
    assert budget.held == 0


def test_a_chunk_that_would_pass_the_budget_is_refused_and_takes_nothing():
    budget, a, b = BodyBudget(100), request(), request()
    budget.take(a, 90)
    with pytest.raises(OverBudget, match="100 bytes"):
        budget.take(b, 11)
    assert budget.held == 90
    budget.release(b)  # a refused request gives back nothing it did not take
    assert budget.held == 90


def test_a_request_is_released_once():
    budget, a = BodyBudget(100), request()
    budget.take(a, 40)
    budget.release(a)
    budget.release(a)
    assert budget.held == 0


def test_a_request_that_never_read_a_body_releases_nothing():
    budget = BodyBudget(100)
    budget.take(request(), 5)
    budget.release(request())
    assert budget.held == 5
