"""An OpenAI-compatible upstream for tests and benchmarks: it answers deterministically, and can
stream, fail, stall and count, standing in for a model server (vLLM, llama.cpp...).

    python3 tests/standin_upstream.py --port 8000 [--token-delay 0.002]

Its behaviour is chosen by markers in the prompt, so one server serves every test:
    [500]   answers 500 with an OpenAI error body and Retry-After: 7
    [429]   answers 429 with Retry-After: 3
    [length] finishes with finish_reason "length" (a truncated answer)
    [tool]  answers with a tool call (streamed: as tool-call deltas, as vLLM sends them)
    [error-mid] streams two words, then an error event, and ends without [DONE]
    [cut]   streams two words, then drops the connection
    [no-finish] streams the answer and [DONE] with no finish_reason
    [reason] answers with reasoning_content beside the text
    [stall] never answers (until the request is closed, or 60 s)
    [drip]  streams one word, then waits for POST /control/drip before the rest (not
            streamed: waits for it before answering)
    [slow]  takes 0.2 s more, so that concurrent requests overlap
``token_delay`` is the time each word of an answer takes, so a benchmark sees a model's cost.
Any other path is answered 200 and recorded in ``app.state.paths`` (method and raw path), so a
test can see what reached the model server. Needs the serve extra (Starlette, uvicorn).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import threading
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def answer_to(text: str) -> str:
    return f"The answer to '{text}' is forty-two."


async def hung_up(request: Request) -> None:
    """Returns when the caller has closed its connection (its body already read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def make_upstream(token_delay: float = 0.0, public_models: bool = False) -> Starlette:
    """The stand-in. It has issued every key a test sends, except those a test revokes and the
    proxy's probe (``gpucache-probe-...``: a key made up to be invalid), which it refuses as an
    upstream with API keys does; ``public_models`` makes its GET /v1/models answer anyone, as
    llama.cpp's server does (its completions still refuse a revoked key)."""
    calls: list[tuple[str, str]] = []
    checks: list[str] = []  # the bearer key of each GET /v1/models (the proxy's probes apart)
    probes: list[str] = []  # the keys of the proxy's probes (auth.py: CredentialCheck.probe)
    revoked: set[str] = set()  # keys the upstream refuses (a test adds them)
    paths: list[tuple[str, str]] = []  # (method, raw path) of requests to any other path
    queries: list[str] = []  # the query string of each completion request
    arrived = threading.Condition()  # notified at each completion request, for tests to wait on
    closed = threading.Event()  # a streamed generation was cut off by its client
    drip = asyncio.Event()

    def text_of(kind: str, body: dict[str, Any]) -> str:
        if kind == "chat":
            content = body["messages"][-1].get("content")
            return content if isinstance(content, str) else " ".join(p["text"] for p in content)
        prompt = body["prompt"]
        return prompt if isinstance(prompt, str) else prompt[0]

    def refused() -> Response:
        return JSONResponse(
            {
                "error": {
                    "message": "Incorrect API key provided",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            },
            status_code=401,
        )

    async def complete(request: Request) -> Response:
        kind = "chat" if request.url.path.endswith("chat/completions") else "completions"
        body = await request.json()
        text = text_of(kind, body)
        calls.append((kind, text))
        queries.append(request.url.query)
        request.app.state.last_headers = dict(request.headers)  # the last completion's, as received
        with arrived:
            arrived.notify_all()
        if request.headers.get("authorization", "").removeprefix("Bearer ").strip() in revoked:
            return refused()  # as the model server refuses a revoked key on every endpoint
        if str(body.get("model", "")).startswith("forbidden"):
            # as a gateway with per-key model lists answers (LiteLLM): the key is valid, and
            # GET /v1/models says so, but not for this model
            return JSONResponse(
                {
                    "error": {
                        "message": "key not allowed to access model",
                        "type": "auth_error",
                        "param": "model",
                        "code": "401",
                    }
                },
                status_code=401,
            )
        if "[500]" in text:
            return JSONResponse(
                {
                    "error": {
                        "message": "the model crashed",
                        "type": "server_error",
                        "param": None,
                        "code": None,
                    }
                },
                status_code=500,
                headers={"retry-after": "7"},
            )
        if "[429]" in text:
            return JSONResponse(
                {"error": {"message": "slow down", "type": "rate_limit", "param": None, "code": None}},
                status_code=429,
                headers={"retry-after": "3"},
            )
        if "[stall]" in text:
            await asyncio.sleep(60)  # stall: only the client giving up ends this
        if "[drip]" in text and not body.get("stream"):
            # held until POST /control/drip, so that requests overlap; a caller that hangs up
            # meanwhile (the proxy cancelling its request) sets ``closed``
            released = asyncio.ensure_future(drip.wait())
            gone = asyncio.ensure_future(hung_up(request))
            await asyncio.wait((released, gone), return_when=asyncio.FIRST_COMPLETED)
            released.cancel()
            gone.cancel()
            if not drip.is_set():
                closed.set()
                return Response(status_code=499)
        if "[slow]" in text:
            await asyncio.sleep(0.2)  # stall: a model's generation time, so requests overlap
        finish = "length" if "[length]" in text else ("tool_calls" if "[tool]" in text else "stop")
        answer = answer_to(text)
        created, model = 1_700_000_000, body["model"]
        if token_delay and not body.get("stream"):
            await asyncio.sleep(token_delay * len(answer.split()))  # stall: the model's generation time
        # "[no-store]": the upstream forbids keeping this answer (Cache-Control: no-store);
        # "[max-age=N]": it lets a cache keep it N seconds. Every answer carries a rate-limit
        # header, as model servers behind a gateway send, which the client must see on a miss.
        control = {"x-ratelimit-remaining-requests": "99"}
        if "[no-store]" in text:
            control["cache-control"] = "no-store"
        lifetime = re.search(r"\[max-age=(\d+)\]", text)
        if lifetime:
            control["cache-control"] = f"max-age={lifetime.group(1)}"
        if body.get("stream"):
            return StreamingResponse(
                stream(kind, model, answer, finish, body, text),
                media_type="text/event-stream",
                headers=control,
            )
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": answer}
            if finish == "tool_calls":
                message = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                }
            if "[reason]" in text:
                message["reasoning_content"] = "Thinking it over first."
            choice["message"] = message
        else:
            choice["text"] = answer
        usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
        return JSONResponse(
            {
                "id": "up-1",
                "object": "chat.completion" if kind == "chat" else "text_completion",
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": usage,
            },
            headers=control,
        )

    def event(obj: str, model: str, choices: list[Any], **extra: Any) -> str:
        doc = {"id": "up-stream", "object": obj, "created": 1, "model": model, "choices": choices, **extra}
        return "data: " + json.dumps(doc) + "\n\n"

    async def stream(kind, model, answer, finish, body, text):
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        try:
            if kind == "chat" and finish == "tool_calls":
                call = {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
                opening = {"role": "assistant", "content": None, "tool_calls": [call]}
                yield event(obj, model, [{"index": 0, "delta": opening, "finish_reason": None}])
                for part in ('{"city": ', '"Lima"}'):
                    delta = {"tool_calls": [{"index": 0, "function": {"arguments": part}}]}
                    yield event(obj, model, [{"index": 0, "delta": delta, "finish_reason": None}])
                yield event(obj, model, [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}])
                yield "data: [DONE]\n\n"
                return
            words = answer.split(" ")
            for i, word in enumerate(words):
                piece = word if i == 0 else " " + word
                choice = (
                    {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                    if kind == "chat"
                    else {"index": 0, "text": piece, "finish_reason": None}
                )
                yield event(obj, model, [choice])
                if i == 1 and "[error-mid]" in text:
                    yield (
                        "data: "
                        + json.dumps(
                            {
                                "error": {
                                    "message": "the model ran out of memory",
                                    "type": "server_error",
                                    "param": None,
                                    "code": None,
                                }
                            }
                        )
                        + "\n\n"
                    )
                    return
                if i == 1 and "[cut]" in text:
                    raise ConnectionAbortedError("the stand-in drops the connection")
                if "[drip]" in text and i == 0:
                    await drip.wait()
                if token_delay:
                    await asyncio.sleep(token_delay)  # stall: one word's generation time
            if "[no-finish]" not in text:
                last = (
                    {"index": 0, "delta": {}, "finish_reason": finish}
                    if kind == "chat"
                    else {"index": 0, "text": "", "finish_reason": finish}
                )
                yield event(obj, model, [last])
            if (body.get("stream_options") or {}).get("include_usage"):
                yield event(
                    obj, model, [], usage={"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
                )
            yield "data: [DONE]\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            closed.set()
            raise

    async def models(request: Request) -> Response:
        # a credential check (the proxy asks before it serves a key: auth.py), recorded apart
        # from the completions; a key in ``revoked`` is refused as a model server refuses it
        key = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        # a key in a ``token`` parameter or a ``session`` cookie is read first, as gateways read
        # one before Authorization (Kong's key-auth reads ``apikey``)
        key = request.query_params.get("token") or request.cookies.get("session") or key
        if request.app.state.public_models:
            (probes if key.startswith("gpucache-probe-") else checks).append(key)
            return JSONResponse({"object": "list", "data": []})
        if key.startswith("gpucache-probe-"):
            probes.append(key)
            return refused()
        checks.append(key)
        if request.app.state.hang_checks:  # a check that never answers: held until the caller gives up
            await hung_up(request)
            return Response(status_code=499)
        if key in revoked:
            return refused()
        return JSONResponse(
            {"object": "list", "data": [{"id": "smol", "object": "model", "created": 1, "owned_by": "test"}]}
        )

    async def embeddings(request: Request) -> Response:
        calls.append(("embeddings", ""))
        return JSONResponse(
            {
                "object": "list",
                "model": "e",
                "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
                "usage": {"prompt_tokens": 1, "total_tokens": 1},
            }
        )

    async def release(request: Request) -> Response:
        drip.set()
        return JSONResponse({"ok": True})

    async def revoke(request: Request) -> Response:
        # for a process of its own (the safety matrix): the key in the body is refused from now
        revoked.add((await request.json())["key"])
        return JSONResponse({"ok": True})

    async def hang_checks(request: Request) -> Response:
        # for a process of its own (the safety matrix): GET /v1/models never answers from now
        request.app.state.hang_checks = True
        return JSONResponse({"ok": True})

    async def anything(request: Request) -> Response:
        raw = request.scope.get("raw_path") or request.url.path.encode()
        paths.append((request.method, raw.decode("latin-1")))
        return JSONResponse({"reached": raw.decode("latin-1")})

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", complete, methods=["POST"]),
            Route("/v1/completions", complete, methods=["POST"]),
            Route("/v1/models", models),
            Route("/v1/embeddings", embeddings, methods=["POST"]),
            Route("/control/drip", release, methods=["POST"]),
            Route("/control/revoke", revoke, methods=["POST"]),
            Route("/control/hang-checks", hang_checks, methods=["POST"]),
            Route("/{path:path}", anything, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
        ]
    )
    app.state.paths = paths
    app.state.queries = queries
    app.state.arrived = arrived
    app.state.calls = calls
    app.state.checks = checks
    app.state.revoked = revoked
    app.state.probes = probes
    app.state.public_models = public_models  # a test may turn it on and off
    app.state.last_headers = {}
    app.state.hang_checks = False  # a test sets it: GET /v1/models then never answers
    app.state.closed = closed
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description="an OpenAI-compatible stand-in upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--token-delay", type=float, default=0.0, help="seconds per generated word")
    parser.add_argument("--public-models", action="store_true", help="GET /v1/models answers any key")
    args = parser.parse_args()
    app = make_upstream(args.token_delay, public_models=args.public_models)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
