"""``gpucache serve`` under more requests than it takes at once (``max_concurrency``): the
request past the bound is shed at once with 503 and Retry-After, counted, and sends nothing
upstream; an exact repeat is still answered from the cache while the bound is full; once the
held requests finish, requests are taken again. Driven by a real server and the official
client, with the stand-in upstream holding its answers until released (an event, no sleep)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
import httpx  # noqa: E402
from serving import Served, answer_to, make_upstream  # noqa: E402

from gpucache import SemanticCache  # noqa: E402
from gpucache.serve.app import create_app  # noqa: E402
from gpucache.serve.settings import ServeSettings  # noqa: E402


def ask(url, text, retries=0):
    c = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=retries)
    return c.chat.completions.with_raw_response.create(
        model="smol", messages=[{"role": "user", "content": text}]
    )


def test_past_max_concurrency_requests_are_shed_and_repeats_still_served(real_embedder):
    with Served(make_upstream()) as upstream:
        config = ServeSettings(upstream=f"{upstream.url}/v1", max_concurrency=2, retry_after=3)
        app = create_app(
            config,
            cache_factory=lambda: SemanticCache(real_embedder, device="cpu", lookup_timeout_seconds=30.0),
        )
        with Served(app) as proxy:
            repeat = "What is the capital of Portugal?"
            assert ask(proxy.url, repeat).headers["x-gpucache"] == "miss"
            held = ["[drip] Tell me about the first held request", "[drip] Tell me about the second held one"]
            answers: dict[str, str] = {}
            threads = [
                threading.Thread(
                    target=lambda t=t: answers.update(
                        {t: ask(proxy.url, t).parse().choices[0].message.content}
                    )
                )
                for t in held
            ]
            for t in threads:
                t.start()
            arrived = upstream.app.state.arrived
            with arrived:  # both held requests have reached the upstream: the bound is full
                assert arrived.wait_for(lambda: len(upstream.app.state.calls) == 3, timeout=60)

            with pytest.raises(openai.APIStatusError) as shed:
                ask(proxy.url, "A third question, while the proxy is full")
            assert shed.value.status_code == 503
            assert shed.value.response.headers["retry-after"] == "3"
            assert shed.value.response.headers["x-should-retry"] == "true"
            assert shed.value.body["code"] == "overloaded"
            assert len(upstream.app.state.calls) == 3  # the shed request went nowhere

            served = ask(proxy.url, repeat)  # an exact repeat takes no slot
            assert served.headers["x-gpucache"] == "exact"
            assert served.parse().choices[0].message.content == answer_to(repeat)

            httpx.post(f"{upstream.url}/control/drip")
            for t in threads:
                t.join(60)
            assert answers == {t: answer_to(t) for t in held}
            assert ask(proxy.url, "A third question, now that there is room").headers["x-gpucache"] == "miss"
            metrics = httpx.get(f"{proxy.url}/metrics").text
            assert 'gpucache_errors_total{kind="shed"} 1.0' in metrics
            assert 'gpucache_requests_total{endpoint="chat/completions",outcome="shed"} 1.0' in metrics


def raw_request(url: str, text: str, key: str = "k"):
    """A chat request sent on a socket of its own, which the caller closes to hang up."""
    import json

    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"model": "smol", "messages": [{"role": "user", "content": text}]}).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"authorization: Bearer {key}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def test_a_client_that_hangs_up_frees_its_slot_and_cancels_its_upstream_request(real_embedder):
    with Served(make_upstream()) as upstream:
        config = ServeSettings(upstream=f"{upstream.url}/v1", max_concurrency=1, retry_after=0)
        app = create_app(
            config,
            cache_factory=lambda: SemanticCache(real_embedder, device="cpu", lookup_timeout_seconds=30.0),
        )
        with Served(app) as proxy:
            sock = raw_request(proxy.url, "[drip] A question whose asker leaves")
            arrived = upstream.app.state.arrived
            with arrived:  # the held request has reached the upstream: the one slot is taken
                assert arrived.wait_for(lambda: len(upstream.app.state.calls) == 1, timeout=60)
            sock.close()
            # the proxy cancels its upstream request: the upstream sees its caller go
            assert upstream.app.state.closed.wait(30)
            # and the slot is free long before the upstream would have answered (it never does:
            # nothing releases it); a shed answer here would mean the slot was still held
            answered = ask(proxy.url, "A question after the first asker left", retries=3)
            assert answered.headers["x-gpucache"] == "miss"


class GatedEmbedder:
    """The real embedder, a call whose texts hold "[hold]" kept inside it until ``release``:
    a test acts while a request is in its lookup (the part of a request the share counts)."""

    def __init__(self, inner):
        self.inner = inner
        self.held = 0
        self._open = False
        self._changed = threading.Condition()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode(self, texts, *args, **kwargs):
        if any("[hold]" in t for t in texts):
            with self._changed:
                self.held += 1
                self._changed.notify_all()
                assert self._changed.wait_for(lambda: self._open, 60)
        return self.inner.encode(texts, *args, **kwargs)

    def entered(self) -> bool:
        """From a thread: wait until a held call has come into ``encode``."""
        with self._changed:
            return self._changed.wait_for(lambda: self.held >= 1, 60)

    def release(self) -> None:
        with self._changed:
            self._open = True
            self._changed.notify_all()


def gauge(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def until_gauge(url: str, name: str, value: float) -> None:
    """Until /metrics says ``name`` is ``value``: another thread's progress inside the server."""
    deadline = time.monotonic() + 60
    while gauge(url, name) != value:
        assert time.monotonic() < deadline, f"{name} never reached {value}"


def share_proxy(upstream, gate: GatedEmbedder, retry_after: int):
    """A proxy with a share of one lookup per credential, its embedder ``gate``."""
    config = ServeSettings(
        upstream=f"{upstream.url}/v1", max_concurrency=8, max_tenant_concurrency=1, retry_after=retry_after
    )
    return create_app(
        config, cache_factory=lambda: SemanticCache(gate, device="cpu", lookup_timeout_seconds=60.0)
    )


def asked_in_thread(url: str, key: str, text: str) -> tuple[threading.Thread, dict[str, object]]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    answered: dict[str, object] = {}

    def ask_it() -> None:
        try:
            answered["r"] = client.chat.completions.with_raw_response.create(
                model="smol", messages=[{"role": "user", "content": text}]
            )
        except openai.APIStatusError as exc:
            answered["error"] = exc.status_code

    thread = threading.Thread(target=ask_it)
    thread.start()
    return thread, answered


def test_a_credential_alone_is_not_held_to_its_share(real_embedder):
    """The single-key deployment loses nothing: a key alone with a share of one has a second
    lookup taken (it gathers behind the first in the embedder) rather than shed."""
    gate = GatedEmbedder(real_embedder)
    with Served(make_upstream()) as upstream, Served(share_proxy(upstream, gate, 0)) as proxy:
        first, first_said = asked_in_thread(proxy.url, "sk-greedy", "[hold] The greedy key's first question")
        assert gate.entered()
        second, second_said = asked_in_thread(proxy.url, "sk-greedy", "The greedy key's second question")
        second.join(60)  # answered while the first is still in its lookup
        assert first.is_alive() and second_said["r"].headers["x-gpucache"] == "miss"
        gate.release()
        for thread in (first, second):
            thread.join(60)
        assert first_said["r"].headers["x-gpucache"] == "miss"


def test_once_another_credential_is_active_one_holds_at_most_its_share_of_lookups(real_embedder):
    """Another key heard from, a key with its share of lookups in the cache has its next
    request shed from its headers (its body never read), while the other key is taken."""
    gate = GatedEmbedder(real_embedder)
    with Served(make_upstream()) as upstream, Served(share_proxy(upstream, gate, 0)) as proxy:
        assert ask(proxy.url, "The patient key's first question").headers["x-gpucache"] == "miss"
        first, first_said = asked_in_thread(proxy.url, "sk-greedy", "[hold] The greedy key's first question")
        assert gate.entered()
        greedy = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-greedy", max_retries=0)
        with pytest.raises(openai.APIStatusError) as shed:
            greedy.chat.completions.create(
                model="smol", messages=[{"role": "user", "content": "The greedy key's second question"}]
            )
        assert shed.value.status_code == 503 and shed.value.body["code"] == "overloaded"
        head = head_of_a_withheld_body(proxy.port, "sk-greedy")
        assert head.startswith(b"HTTP/1.1 503 ") and b"connection: close" in head.lower()
        # another key is taken: answered while the greedy key's lookup is still held
        assert ask(proxy.url, "Another key's question meanwhile").headers["x-gpucache"] == "miss"
        assert first.is_alive()
        gate.release()
        first.join(60)
        assert first_said["r"].headers["x-gpucache"] == "miss"


def test_a_request_past_its_share_waits_for_its_own_turn_and_is_then_served(real_embedder):
    """A client that ignores Retry-After is not answered 503 the moment it asks (shed at once, a
    flood of such answers takes the event loop from everyone): its request waits, headers read,
    for its own credential's turn, up to ``retry_after``, and is served once the lookup before
    it is done."""
    gate = GatedEmbedder(real_embedder)
    with Served(make_upstream()) as upstream, Served(share_proxy(upstream, gate, 120)) as proxy:
        assert ask(proxy.url, "The patient key's first question").headers["x-gpucache"] == "miss"
        first, first_said = asked_in_thread(proxy.url, "sk-greedy", "[hold] The greedy key's first question")
        assert gate.entered()
        second, second_said = asked_in_thread(proxy.url, "sk-greedy", "The greedy key's next question")
        until_gauge(proxy.url, "gpucache_share_waits", 1)
        assert second.is_alive() and first.is_alive()  # waiting for its turn, not shed
        gate.release()
        for thread in (first, second):
            thread.join(60)
        served = second_said["r"]
        assert served.headers["x-gpucache"] == "miss"
        assert served.parse().choices[0].message.content == answer_to("The greedy key's next question")
        assert gauge(proxy.url, "gpucache_share_waits") == 0


def test_a_request_gone_upstream_leaves_its_credentials_share(real_embedder):
    """What the share bounds is the embedder, not the model server: with a key's request
    waiting on the upstream, its next one is looked up and served at once."""
    gate = GatedEmbedder(real_embedder)
    with Served(make_upstream()) as upstream, Served(share_proxy(upstream, gate, 0)) as proxy:
        assert ask(proxy.url, "The patient key's first question").headers["x-gpucache"] == "miss"
        arrived = upstream.app.state.arrived
        held = raw_request(proxy.url, "[drip] The greedy key's long generation", key="sk-greedy")
        with arrived:
            assert arrived.wait_for(lambda: len(upstream.app.state.calls) == 2, timeout=60)
        greedy = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-greedy", max_retries=0)
        answered = greedy.chat.completions.with_raw_response.create(
            model="smol", messages=[{"role": "user", "content": "The greedy key's next question"}]
        )
        assert answered.headers["x-gpucache"] == "miss"
        httpx.post(f"{upstream.url}/control/drip")
        held.close()


def test_a_connection_that_trickles_or_withholds_its_headers_is_closed_and_others_are_not(real_embedder):
    """The slowloris attack: connections that send nothing, or half a request head, are closed
    after ``header_timeout``; a request whose answer takes longer than that is not cut."""
    from gpucache.serve.connections import header_deadline

    with Served(make_upstream()) as upstream:
        config = ServeSettings(upstream=f"{upstream.url}/v1")
        app = create_app(
            config,
            cache_factory=lambda: SemanticCache(real_embedder, device="cpu", lookup_timeout_seconds=30.0),
        )
        protocol = header_deadline(0.3)
        with Served(app, http=protocol) as proxy:
            held: dict[str, object] = {}
            asker = threading.Thread(
                target=lambda: held.update(
                    r=ask(proxy.url, "[drip] A question that outlives the header deadline")
                )
            )
            asker.start()
            arrived = upstream.app.state.arrived
            with arrived:  # its headers were complete long ago: it is past the deadline's reach
                assert arrived.wait_for(lambda: len(upstream.app.state.calls) == 1, timeout=60)
            silent = [socket.create_connection(("127.0.0.1", proxy.port)) for _ in range(3)]
            trickling = [socket.create_connection(("127.0.0.1", proxy.port)) for _ in range(2)]
            for sock in trickling:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")  # and no more
            for sock in silent + trickling:
                sock.settimeout(30)
                assert sock.recv(1024) == b""  # the server closed it
                sock.close()
            assert protocol.closed_slow == 5
            httpx.post(f"{upstream.url}/control/drip")
            asker.join(60)
            assert held["r"].headers["x-gpucache"] == "miss"  # the slow answer was not cut
            assert ask(proxy.url, "A prompt question after all that").headers["x-gpucache"] == "miss"


def head_of_a_withheld_body(port: int, key: str) -> bytes:
    """The head of the answer to a chat request that declares a 5 MB body and sends one byte of
    it, read until the server closes the connection: a request refused from its headers."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(30)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer "
        + key.encode()
        + b"\r\ncontent-type: application/json\r\ncontent-length: 5000000\r\n\r\n{"
    )  # no more
    head, _, _ = read_to_close(sock).partition(b"\r\n\r\n")
    sock.close()
    return head


def read_to_close(sock) -> bytes:
    """Everything the server sends until it closes the connection."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
def test_a_body_that_does_not_arrive_in_time_is_answered_408_and_its_connection_closed(real_embedder, path):
    """A client that sends its headers and then trickles or withholds its body holds a
    connection and its buffered bytes only ``body_timeout`` seconds: it is answered 408
    (``request_timeout``), counted, the connection closed, and nothing reaches the upstream,
    on a cached endpoint and on a passthrough path alike."""
    with Served(make_upstream()) as upstream:
        config = ServeSettings(upstream=f"{upstream.url}/v1", body_timeout=0.5)
        app = create_app(
            config,
            cache_factory=lambda: SemanticCache(real_embedder, device="cpu", lookup_timeout_seconds=30.0),
        )
        with Served(app) as proxy:
            sock = socket.create_connection(("127.0.0.1", proxy.port))
            sock.settimeout(30)
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer k\r\n"
                "content-type: application/json\r\ncontent-length: 100\r\n\r\n".encode()
                + b'{"model": "smol", '
            )  # and the rest never comes
            answer = read_to_close(sock)  # the server closes it
            sock.close()
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408 "), answer[:200]
            assert b"connection: close" in head.lower()
            assert b"request_timeout" in body
            assert upstream.app.state.calls == []
            metrics = httpx.get(f"{proxy.url}/metrics").text
            assert 'gpucache_errors_total{kind="body_timeout"} 1.0' in metrics
            assert ask(proxy.url, "A question sent whole afterwards").headers["x-gpucache"] == "miss"


def test_the_body_deadline_must_be_positive():
    from gpucache.serve.settings import ConfigError

    with pytest.raises(ConfigError, match="body_timeout"):
        ServeSettings(upstream="http://127.0.0.1:1/v1", body_timeout=0)


def body_bytes_held(url) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("gpucache_request_body_bytes "):
            return float(line.split()[1])
    raise AssertionError("no gpucache_request_body_bytes in /metrics")


def wait_for_held(url, size) -> None:
    """Until the proxy reports ``size`` bytes of bodies held (a condition, with a deadline)."""
    import time

    deadline = time.monotonic() + 30
    while body_bytes_held(url) != size:
        assert time.monotonic() < deadline, f"the proxy never held {size} body bytes"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
def test_bodies_past_the_budget_all_requests_share_are_shed_and_given_back_when_answered(real_embedder, path):
    """The bytes of bodies all requests hold at once are bounded (``max_buffered_bytes``), on
    a cached endpoint and a passthrough path alike: while one client's half-sent body holds
    most of the budget, a body that would pass it is answered 503 with Retry-After, counted,
    its connection closed, and nothing reaches the upstream; once the first body is complete
    and answered its bytes are given back, and the refused request, sent again, is served."""
    import json

    with Served(make_upstream()) as upstream:
        config = ServeSettings(
            upstream=f"{upstream.url}/v1",
            max_body_bytes=64 * 1024,
            max_buffered_bytes=96 * 1024,
            retry_after=2,
        )
        app = create_app(
            config,
            cache_factory=lambda: SemanticCache(real_embedder, device="cpu", lookup_timeout_seconds=30.0),
        )
        with Served(app) as proxy:
            whole = json.dumps(
                {"model": "smol", "messages": [{"role": "user", "content": "x" * 59_000}], "input": "a"}
            ).encode()
            first, rest = whole[:50_000], whole[50_000:]
            holder = socket.create_connection(("127.0.0.1", proxy.port))
            holder.settimeout(30)
            holder.sendall(
                f"POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer k\r\n"
                f"content-type: application/json\r\ncontent-length: {len(whole)}\r\n\r\n".encode()
                + first
            )
            wait_for_held(proxy.url, len(first))

            large = "Tell me everything about " + "y" * 50_000
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)

            def send():
                if path == "/v1/embeddings":
                    return client.embeddings.with_raw_response.create(model="smol", input=large)
                return client.chat.completions.with_raw_response.create(
                    model="smol", messages=[{"role": "user", "content": large}]
                )

            with pytest.raises(openai.APIStatusError) as shed:
                send()
            assert shed.value.status_code == 503
            assert shed.value.response.headers["retry-after"] == "2"
            assert shed.value.response.headers["connection"] == "close"
            assert shed.value.body["code"] == "overloaded"
            assert upstream.app.state.calls == []
            assert 'gpucache_errors_total{kind="body_budget"} 1.0' in httpx.get(f"{proxy.url}/metrics").text

            holder.sendall(rest)
            head = holder.recv(65536)
            holder.close()
            assert head.startswith(b"HTTP/1.1 200 "), head[:200]
            assert body_bytes_held(proxy.url) == 0  # given back when it was answered
            assert send().http_response.status_code == 200  # the refused request, sent again
            assert body_bytes_held(proxy.url) == 0


def test_the_body_budget_holds_at_least_one_whole_body():
    from gpucache.serve.settings import ConfigError

    with pytest.raises(ConfigError, match="max_buffered_bytes"):
        ServeSettings(upstream="http://127.0.0.1:1/v1", max_body_bytes=2**20, max_buffered_bytes=2**20 - 1)


def test_a_credential_past_its_rate_is_answered_429_before_its_body_and_others_are_served(real_embedder):
    """``tenant_rate``: a credential that sends past its bucket is answered 429 with
    Retry-After (``rate_limit_exceeded``), counted, from its headers alone (a large body is
    never read: the connection is closed), and nothing reaches the upstream; another key, and
    the keys' exact repeats, are served as before."""
    with Served(make_upstream()) as upstream:
        config = ServeSettings(upstream=f"{upstream.url}/v1", tenant_rate=0.001, tenant_burst=2)
        app = create_app(
            config,
            cache_factory=lambda: SemanticCache(real_embedder, device="cpu", lookup_timeout_seconds=30.0),
        )
        with Served(app) as proxy:
            flooding = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-flood", max_retries=0)

            def flood(text):
                return flooding.chat.completions.with_raw_response.create(
                    model="smol", messages=[{"role": "user", "content": text}]
                )

            assert flood("What is the tallest mountain in Europe?").headers["x-gpucache"] == "miss"
            assert flood("How long is the river Danube?").headers["x-gpucache"] == "miss"
            calls = len(upstream.app.state.calls)
            with pytest.raises(openai.RateLimitError) as limited:
                flood("What is the tallest mountain in Europe?")  # a repeat counts too
            assert limited.value.status_code == 429
            assert limited.value.body["code"] == "rate_limit_exceeded"
            assert 990 <= int(limited.value.response.headers["retry-after"]) <= 1000

            head = head_of_a_withheld_body(proxy.port, "sk-flood")
            assert head.startswith(b"HTTP/1.1 429 ") and b"connection: close" in head.lower()
            assert len(upstream.app.state.calls) == calls  # nothing went upstream

            other = ask(proxy.url, "What is the tallest mountain in Europe?")  # another key: "k"
            assert other.headers["x-gpucache"] == "miss"
            metrics = httpx.get(f"{proxy.url}/metrics").text
            assert 'gpucache_errors_total{kind="rate_limit"} 2.0' in metrics


@pytest.mark.parametrize("option", [{"tenant_rate": 0.0}, {"tenant_rate": -1.0}, {"tenant_burst": 0}])
def test_a_rate_limit_needs_a_positive_rate_and_burst_to_start(option):
    from gpucache.serve.settings import ConfigError

    with pytest.raises(ConfigError, match="tenant_"):
        ServeSettings(upstream="http://127.0.0.1:1/v1", **option)
