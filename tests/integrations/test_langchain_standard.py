"""LangChain's own contract for a cache (langchain-tests' standard suites), run on the adapter.

The suites are what LangChain's caches (InMemoryCache and the rest) pass: an update is looked up
as the very generations stored, ``generation_info`` and several generations included. Each test
gets an empty cache, as the suites require; the real embedder is loaded once for the session.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langchain_tests")

# The adapter revives records with langchain_core.load.loads, which LangChain marks beta and warns
# about once a process, at whichever test looks a record up first.
pytestmark = pytest.mark.filterwarnings("ignore:The function `loads` is in beta")

from langchain_core.caches import BaseCache  # noqa: E402
from langchain_tests.integration_tests import AsyncCacheTestSuite, SyncCacheTestSuite  # noqa: E402

from gpucache import SemanticCache  # noqa: E402
from gpucache.integrations.langchain import GpuSemanticCache  # noqa: E402


def _empty_adapter(embedder) -> Iterator[GpuSemanticCache]:
    semantic = SemanticCache(embedder, device="cpu")
    yield GpuSemanticCache(semantic)
    semantic.close()


class TestSyncCacheSuite(SyncCacheTestSuite):
    @pytest.fixture
    def cache(self, real_embedder) -> Iterator[BaseCache]:
        yield from _empty_adapter(real_embedder)


# The async suite's tests are coroutines with no asyncio mark of their own (LangChain runs them
# in pytest-asyncio's auto mode); the mark on the class also reaches the suite's one plain test,
# which pytest-asyncio then warns about.
@pytest.mark.asyncio
@pytest.mark.filterwarnings(
    "ignore:The test <Function test_no_overrides_DO_NOT_OVERRIDE> is marked:pytest.PytestWarning"
)
class TestAsyncCacheSuite(AsyncCacheTestSuite):
    @pytest.fixture
    def cache(self, real_embedder) -> Iterator[BaseCache]:
        yield from _empty_adapter(real_embedder)
