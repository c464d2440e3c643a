"""The proxy in front of hostile clients: each case, sent to a running ``gpucache serve``, and
what it answered. Tenancy, the passthrough, streams and cache controls, as a matrix.

    python3 bench/serve_safety.py --out bench/reports/serve-safety.md

Everything runs on 127.0.0.1: the stand-in upstream (tests/standin_upstream.py) and two proxies
(``gpucache serve``: one as deployed by default, one behind a gateway with
``--trust-namespace-header --require-auth``), each in a process of its own. Requests go out as
a client would send them: httpx, the official ``openai`` client for streams, and a raw socket for
paths that a client library would tidy before sending.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).parent))
from serve import free_port, proxy_command, start, stop  # noqa: E402

# the stand-in model server, test support (an OpenAI-compatible upstream that answers at once)
STANDIN = Path(__file__).resolve().parents[1] / "tests" / "standin_upstream.py"

SECRET = "a-stable-secret-for-the-safety-matrix"


def raw_status(url: str, method: str, target: str) -> str:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        reply = b""
        while True:
            part = sock.recv(65536)
            if not part:
                break
            reply += part
    head, _, body = reply.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1].decode()
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = "reached the model server" if b"reached" in body else "-"
    return f"{status} ({code})"


def ask(url: str, headers: dict[str, str], text: str, cache_control: str | None = None) -> str:
    body = {"model": "smol", "messages": [{"role": "user", "content": text}]}
    extra = {"cache-control": cache_control} if cache_control else {}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers={**headers, **extra}, timeout=60)
    return (
        r.headers.get("x-gpucache", "-")
        if r.status_code == 200
        else f"{r.status_code} ({r.json()['error']['code']})"
    )


def stream(url: str, text: str, **kwargs: object) -> str:
    c = openai.OpenAI(base_url=f"{url}/v1", api_key="key-stream", max_retries=0)
    raw = c.chat.completions.with_raw_response.create(
        model="smol", stream=True, messages=[{"role": "user", "content": text}], **kwargs
    )
    tier = raw.headers.get("x-gpucache")
    calls, finish, content = "", None, ""
    try:
        for chunk in raw.parse():
            for choice in chunk.choices:
                for call in choice.delta.tool_calls or []:
                    calls += (call.function.name or "") + (call.function.arguments or "")
                content += choice.delta.content or ""
                finish = choice.finish_reason or finish
    except openai.APIError as exc:
        return f"{tier}; the client raised APIError: {str(exc)[:60]}"
    shown = f"tool call {calls}" if calls else f"{len(content.split())} words"
    return f"{tier}; {shown}; finish_reason {finish}"


def main() -> None:
    parser = argparse.ArgumentParser(description="the proxy asked each hostile case, as a client would")
    parser.add_argument("--out", default="bench/reports/serve-safety.md", help="the report written")
    out = parser.parse_args().out
    os.environ["GPUCACHE_NAMESPACE_SECRET"] = SECRET  # the proxies started below inherit it
    up_port, proxy_port, gate_port = free_port(), free_port(), free_port()
    upstream = start(
        [sys.executable, str(STANDIN), "--port", str(up_port)],
        f"http://127.0.0.1:{up_port}/v1/models",
    )
    serve = proxy_command(up_port)
    processes = [upstream]
    try:
        proxy, gate = f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{gate_port}"
        processes.append(start(serve + ["--port", str(proxy_port)], f"{proxy}/health"))
        processes.append(
            start(
                serve + ["--port", str(gate_port), "--trust-namespace-header", "--require-auth"],
                f"{gate}/health",
            )
        )
        rows: list[tuple[str, str, str]] = []
        q = "What is team A's launch date?"
        alice = {"authorization": "Bearer key-alice", "x-gpucache-namespace": "team-a"}
        rows.append(("tenancy", "key-alice + namespace team-a stores an answer", ask(proxy, alice, q)))
        for case, headers in [
            ("the same key and namespace", alice),
            ("another key, namespace team-a", {**alice, "authorization": "Bearer key-mallory"}),
            ("no key, namespace team-a", {"x-gpucache-namespace": "team-a"}),
            ("key-alice, no namespace", {"authorization": "Bearer key-alice"}),
            (
                "api-key: key-alice (Azure style), namespace team-a",
                {"api-key": "key-alice", "x-gpucache-namespace": "team-a"},
            ),
            ("namespace 'team-a/../x'", {**alice, "x-gpucache-namespace": "team-a/../x"}),
        ]:
            rows.append(("tenancy", f"asks again: {case}", ask(proxy, headers, q)))
        rows.append(
            (
                "tenancy",
                "x-api-key: k1 stores; x-api-key: k1 asks again",
                (
                    ask(proxy, {"x-api-key": "k1"}, "What are my notes?"),
                    ask(proxy, {"x-api-key": "k1"}, "What are my notes?"),
                )[1],
            )
        )
        rows.append(
            ("tenancy", "x-api-key: k2 asks the same", ask(proxy, {"x-api-key": "k2"}, "What are my notes?"))
        )
        rows.append(
            (
                "gateway",
                "--trust-namespace-header: tenant-7 via key-one stores",
                ask(gate, {"authorization": "Bearer key-one", "x-gpucache-namespace": "tenant-7"}, q),
            )
        )
        rows.append(
            (
                "gateway",
                "tenant-7 via key-two (the gateway's own key) asks again",
                ask(gate, {"authorization": "Bearer key-two", "x-gpucache-namespace": "tenant-7"}, q),
            )
        )
        rows.append(("gateway", "--require-auth: no credentials, no namespace", ask(gate, {}, q)))
        for method, target in [
            ("GET", "/v1/models"),
            ("GET", "/v1/../metrics"),
            ("GET", "/v1/%2e%2e/metrics"),
            ("POST", "/v1/..%2Fapi/delete"),
            ("DELETE", "/v1/%2E%2E/api/delete"),
            ("GET", "/v1/models/..%2f..%2fhealth"),
            ("GET", "/v1/models\\..\\x"),
            ("DELETE", "/v1/models/smol"),
            ("GET", "/v1/tokenize"),
            ("POST", "/v1/files"),
        ]:
            rows.append(("passthrough", f"`{method} {target}`", raw_status(proxy, method, target)))
        weather = [
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
        ]
        rows.append(
            (
                "stream",
                "a tool call, streamed (miss)",
                stream(proxy, "[tool] Weather in Lima?", tools=weather),
            )
        )
        rows.append(("stream", "the same again", stream(proxy, "[tool] Weather in Lima?", tools=weather)))
        rows.append(("stream", "an error event after two words", stream(proxy, "[error-mid] A long story")))
        rows.append(
            ("stream", "the upstream drops the connection after two words", stream(proxy, "[cut] A story"))
        )
        rows.append(
            ("stream", "no finish_reason from the upstream", stream(proxy, "[no-finish] Count to three"))
        )
        rows.append(
            (
                "stream",
                "a plain answer (miss), then again",
                (stream(proxy, "Name a large river"), stream(proxy, "Name a large river"))[1],
            )
        )
        hdr = {"authorization": "Bearer key-cc"}
        rows.append(
            (
                "cache-control",
                "`max-age=10000000000000000` (miss, stored)",
                ask(proxy, hdr, "How tall is Aconcagua?", "max-age=10000000000000000"),
            )
        )
        rows.append(("cache-control", "then a plain repeat", ask(proxy, hdr, "How tall is Aconcagua?")))
        rows.append(("cache-control", "`max-age=` and 10,000 nines (past Python's digits for int())",
                     ask(proxy, hdr, "How tall is Aconcagua?", "max-age=" + "9" * 10_000)))
        rows.append(
            (
                "cache-control",
                "`max-age=0` on the stored question",
                ask(proxy, hdr, "How tall is Aconcagua?", "max-age=0"),
            )
        )
        rows.append(
            ("cache-control", "`max-age=soon`", ask(proxy, hdr, "How tall is Aconcagua?", "max-age=soon"))
        )
        rows.append(
            (
                "cache-control",
                "another tenant's `no-cache` on the same question",
                ask(proxy, {"authorization": "Bearer key-other"}, "How tall is Aconcagua?", "no-cache"),
            )
        )
        rows.append(("cache-control", "then the first tenant asks again (its own entry, untouched)",
                     ask(proxy, hdr, "How tall is Aconcagua?")))
        deep = '{"model": "smol", "messages": [], "x": ' + "[" * 5000 + "]" * 5000 + "}"
        r = httpx.post(
            f"{proxy}/v1/chat/completions",
            content=deep.encode(),
            headers={"content-type": "application/json"},
        )
        rows.append(("body", "JSON nested 5,000 deep", f"{r.status_code} ({r.json()['error']['code']})"))
    finally:
        for process in processes:
            stop(process)
    lines = [
        "# gpucache serve in front of hostile clients",
        "",
        "Reproduce: `python3 bench/serve_safety.py --out bench/reports/serve-safety.md`",
        "",
        "Each row is one request to a running proxy (`gpucache serve`, defaults) or, for the gateway "
        "rows, to one started with `--trust-namespace-header --require-auth`, in front of the stand-in "
        "upstream. An answer is the `x-gpucache` header (`exact`, `semantic`, `miss`), or the status and "
        "the error's code; for streams, what the official `openai` client read.",
        "",
        "| area | request | answer |",
        "|---|---|---|",
    ]
    lines += [f"| {area} | {case} | {answer} |" for area, case, answer in rows]
    Path(out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
