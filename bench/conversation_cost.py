"""What matching a conversation by meaning costs a lookup: a single-turn lookup beside the same
request after 2, 16 and 64 earlier messages, through a real ``SemanticCache`` (the shipped
embedder, CPU), with a stored conversation that the semantic tier finds and the context matcher
judges; and the matcher alone (it keeps no memo: each comparison reads both sides).

    python bench/conversation_cost.py --out bench/reports/conversation-cost.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from provenance import run_label  # noqa: E402

from gpucache import ContextMatcher, Conversation, SemanticCache, Turn  # noqa: E402

# an exchange of a long support chat, repeated about other parcels to make 64 messages
EXCHANGES = [
    (
        "my parcel {n} hasn't arrived, it was supposed to come on the {i}th",
        "I'm sorry about that. Parcel {n} left our warehouse on the {i}th and is with the courier.",
    ),
    (
        "can you check which courier has parcel {n} and when they expect to deliver",
        "Parcel {n} is with Parcelway; their latest scan was in Leeds at 0{i}:40 this morning.",
    ),
    (
        "also I want parcel {n} delivered to my office at {i} Mill Lane",
        "Done: the courier will deliver parcel {n} to {i} Mill Lane instead.",
    ),
    (
        "thanks! is the blender in parcel {n} covered by a warranty",
        "Yes, the Vortex {i}00 blender in parcel {n} has a two-year warranty from the delivery date.",
    ),
]
FINAL = "how do I register it for the warranty?"


def conversation(messages: int, variant: int) -> Conversation:
    turns = []
    for n in range(messages // 2):
        user, assistant = EXCHANGES[n % len(EXCHANGES)]
        fill = {"n": 4411 + n, "i": n % 9 + 1}
        turns += [Turn("user", user.format(**fill)), Turn("assistant", assistant.format(**fill))]
    if variant:  # the same conversation with a greeting first: a semantic candidate, not exact
        turns = [Turn("user", "hi there"), Turn("assistant", "Hello! How can I help?"), *turns]
    return Conversation(FINAL, tuple(turns))


def timed(call, rounds: int) -> float:  # type: ignore[no-untyped-def]
    """Median milliseconds of ``call`` over ``rounds`` runs."""
    samples = []
    for _ in range(rounds):
        began = time.perf_counter()
        call()
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cache = SemanticCache(device="cpu", match_context=True)
    matcher = ContextMatcher()
    rows = []
    cache.put(FINAL, "From the app, under Products.", scope="single")
    single = timed(lambda: cache.get("how can I register it for warranty?", scope="single"), args.rounds)
    for messages in (2, 16, 64):
        stored, asked = conversation(messages, 0), conversation(messages, 1)
        scope = f"m{messages}"
        cache.put(stored, "From the app, under Products.", scope=scope)
        assert cache.get(asked, scope=scope) is not None, "the bench's pair must be served"
        lookup = timed(lambda: cache.get(asked, scope=scope), args.rounds)  # noqa: B023

        rows.append(
            (
                messages,
                lookup,
                lookup - single,
                timed(lambda: matcher.explain(stored, asked), args.rounds),  # noqa: B023
            )
        )
    lines = [
        "# What matching a conversation costs a lookup",
        "",
        f"Command: `python bench/conversation_cost.py`; {run_label(cache.embedder)}; timed on 1 "
        "thread; embedder "
        f"{cache.embedder.name}; medians of {args.rounds} runs. A semantic hit each time: the "
        "stored conversation is found by the final request, and the matcher judges its turns.",
        "",
        f"Single-turn semantic lookup: {single:.2f} ms.",
        "",
        "| earlier messages | lookup (ms) | added to a single-turn lookup (ms) | matcher alone (ms) |",
        "|---:|---:|---:|---:|",
    ]
    lines += [f"| {m} | {lookup:.2f} | {added:+.2f} | {alone:.3f} |" for m, lookup, added, alone in rows]
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text, "utf-8")
    print(text)


if __name__ == "__main__":
    main()
