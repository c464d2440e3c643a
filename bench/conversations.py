"""How many conversation pairs the cache serves: conversations matched by meaning beside keying on
the last message alone and keying on every earlier turn exactly.

Each pair (data/conversations_tuning.jsonl's shape: ``a`` and ``b`` message lists, ``label`` 1
where b may be served a's answer, ``kind`` naming the case) is run through a real
``SemanticCache`` (the shipped embedder, the default guard and threshold) in a scope of its own:
a is stored, then b is looked up, three ways:

    conversation   b as a ``Conversation`` after a stored as one (the context matcher:
                   ``match_context`` on)
    last message   the final user messages alone (context ignored: what most caches do)
    every turn     the final user message in a scope that holds every earlier turn (exact
                   context: gpucache serve before conversations were matched by meaning)

A system prompt keys the scope in all three. Writes a markdown report with the served share of
each label and kind, and the verdicts of the pairs served wrongly and missed (with
``--explain``), so a tuning session can read why.

    python bench/conversations.py data/conversations_tuning.jsonl --out /tmp/conv.md --explain
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provenance import run_label  # noqa: E402

from gpucache import ContextMatcher, Conversation, SemanticCache  # noqa: E402
from gpucache.conversation.value import Turn  # noqa: E402

WAYS = ("conversation", "last message", "every turn")


def split(messages: list[dict[str, Any]]) -> tuple[str, Conversation]:
    """(the system prompts joined, the conversation after them)."""
    system = "\n".join(m["content"] for m in messages if m["role"] == "system")
    turns = [Turn(m["role"], m["content"]) for m in messages if m["role"] != "system"]
    return system, Conversation(turns[-1].text, tuple(turns[:-1]))


def digest(*parts: str) -> str:
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).hexdigest()


def run(cache: SemanticCache, pairs: list[dict[str, Any]]) -> dict[str, list[tuple[dict[str, Any], bool]]]:
    out: dict[str, list[tuple[dict[str, Any], bool]]] = {w: [] for w in WAYS}
    for pair in pairs:
        sys_a, a = split(pair["a"])
        sys_b, b = split(pair["b"])
        base = f"{pair['id']}/{digest(sys_a)}", f"{pair['id']}/{digest(sys_b)}"
        cache.put(a, "A", scope=f"c/{base[0]}")
        out["conversation"].append((pair, cache.get(b, scope=f"c/{base[1]}") is not None))
        cache.put(a.request, "A", scope=f"l/{base[0]}")
        out["last message"].append((pair, cache.get(b.request, scope=f"l/{base[1]}") is not None))
        ctx_a = json.dumps([[t.role, t.text] for t in a.context])
        ctx_b = json.dumps([[t.role, t.text] for t in b.context])
        cache.put(a.request, "A", scope=f"e/{base[0]}/{digest(ctx_a)}")
        hit = cache.get(b.request, scope=f"e/{base[1]}/{digest(ctx_b)}")
        out["every turn"].append((pair, hit is not None))
    return out


def share(rows: list[tuple[dict[str, Any], bool]]) -> str:
    if not rows:
        return "–"
    return f"{100 * sum(s for _, s in rows) / len(rows):.1f}% ({sum(s for _, s in rows)}/{len(rows)})"


def report(
    path: Path,
    results: dict[str, list[tuple[dict[str, Any], bool]]],
    cache: SemanticCache,
    explain: bool,
    seconds: float,
) -> str:
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    lines = [
        f"# Conversations served: `{path.name}`",
        "",
        f"Command: `python bench/conversations.py {shown}`"
        f"; {run_label(cache.embedder)}; "
        f"embedder {cache.embedder.name}, threshold {cache.threshold}, guard "
        f"{cache.verifier.name}; {seconds:.0f} s.",
        "",
        "| pairs | " + " | ".join(WAYS) + " |",
        "|---|" + "---:|" * len(WAYS),
    ]
    for label, name in ((1, "should share an answer: served"), (0, "should not: served (wrong answers)")):
        cells = [share([(p, s) for p, s in results[w] if p["label"] == label]) for w in WAYS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "| kind | label | " + " | ".join(WAYS) + " |", "|---|---:|" + "---:|" * len(WAYS)]
    kinds = sorted({(p["label"], p["kind"]) for p, _ in results["conversation"]}, key=lambda k: (-k[0], k[1]))
    for label, kind in kinds:
        cells = [
            share([(p, s) for p, s in results[w] if p["kind"] == kind and p["label"] == label]) for w in WAYS
        ]
        lines.append(f"| {kind} | {label} | " + " | ".join(cells) + " |")
    for length in ("short", "long"):
        for label in (1, 0):
            rows = [
                (p, s)
                for p, s in results["conversation"]
                if p.get("length") == length and p["label"] == label
            ]
            lines.append(f"\n{length}, label {label}: conversation {share(rows)}")
    if explain:
        matcher = ContextMatcher()  # the cache's default
        lines += ["", "## Wrong answers and misses (conversation)", ""]
        for pair, served in results["conversation"]:
            if served != bool(pair["label"]):
                _, a = split(pair["a"])
                _, b = split(pair["b"])
                guard = cache.verifier.explain(a.request, b.request)  # type: ignore[attr-defined]
                verdict = guard if guard.rejected else matcher.explain(a, b)
                lines.append(f"- {pair['id']} ({'served' if served else 'missed'}): {verdict}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("pairs", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--explain", action="store_true")
    args = parser.parse_args()
    pairs = [json.loads(line) for line in args.pairs.read_text("utf-8").splitlines() if line.strip()]
    # match_context on: the "conversation" way is the matcher's (the "every turn" way keys the
    # earlier turns into the scope itself, as match_context off would compare them)
    cache = SemanticCache(device="cpu", capacity=8 * len(pairs) + 8, match_context=True)
    began = time.perf_counter()
    results = run(cache, pairs)
    text = report(args.pairs.resolve(), results, cache, args.explain, time.perf_counter() - began)
    if args.out:
        args.out.write_text(text, "utf-8")
    print(text)


if __name__ == "__main__":
    main()
