"""What ``ContentPolicy.decide`` costs on text written to make its patterns backtrack.

Why it matters: ``re`` holds the GIL for a whole search, so while one request's text is scanned
no other request's work runs, the event loop's included. A pattern that is quadratic on some
input lets one prompt stop every tenant (the e-mail pattern before this benchmark: seconds on
tens of thousands of characters of "a.").

Each family is a short unit repeated, then "!", to the length asked; a cell is the best of
``--repeats`` calls of ``decide(text, answer)`` and ``decide(question, text)`` together.
``--before REV`` loads ``gpucache/policy/content.py`` as it was at REV (the module imports the
standard library alone) and measures it in the same run, at the sizes up to ``--before-max``
(a quadratic pattern at the scan cap takes minutes). Growth is the cost at the largest size over
the cost at a size four times smaller: 4x for a linear scan, 16x for a quadratic one.

    python3 bench/policy_cost.py --before 6cdc01f --out bench/reports/policy-cost.md
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from provenance import run_label  # noqa: E402

FAMILIES = {
    "address characters, no @": "a.",
    "digits and dashes": "1-",
    "JWT-looking runs": "eyJ-",
    "a JWT's first segment, again and again": "eyJaaaaaaaa.eyJ-",
    "@ before a dotted name": "@a.",
    "a word and an @": "a@",
    "OpenAI key prefixes": "sk-",
    "Slack token prefixes": "xoxa-",
    "digits and spaces": "1 ",
    "country codes": "+1 ",
    "words (ordinary prose)": "the cat sat on the mat ",
}
SIZES = (12_500, 50_000, 200_000)


def policy_of(module: ModuleType) -> Any:
    return module.ContentPolicy()


def load_at(rev: str) -> ModuleType:
    """``gpucache/policy/content.py`` as committed at ``rev``, as a module of its own."""
    source = subprocess.run(
        ["git", "show", f"{rev}:gpucache/policy/content.py"], capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "content_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("content_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["content_before"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def cost(policy: Any, text: str, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        policy.decide(text, "an answer", "default")
        policy.decide("a question", text, "default")
        best = min(best, time.perf_counter() - began)
    return best


def row(policy: Any, unit: str, sizes: tuple[int, ...], repeats: int) -> list[float]:
    # n characters in all, the scan cap included: one more would be refused unread (too-large)
    return [cost(policy, (unit * (n // len(unit) + 1))[: n - 1] + "!", repeats) for n in sizes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=None, help="a commit whose policy is measured beside")
    parser.add_argument("--before-max", type=int, default=50_000, help="largest size measured before")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from gpucache.policy import content

    now = policy_of(content)
    before = policy_of(load_at(args.before)) if args.before else None
    before_sizes = tuple(n for n in SIZES if n <= args.before_max)
    head = " | ".join(f"{n:,} chars" for n in SIZES)
    lines = [f"| family (unit repeated) | {head} | growth, 4x the text |", "|---" * (len(SIZES) + 2) + "|"]
    for name, unit in FAMILIES.items():
        cells = row(now, unit, SIZES, args.repeats)
        text = " | ".join(f"{c * 1e3:.1f} ms" for c in cells)
        lines.append(f"| {name} (`{unit!r}`) | {text} | {cells[-1] / cells[-2]:.1f}x |")
        if before is not None:
            old = row(before, unit, before_sizes, 1)
            text = " | ".join([f"{c * 1e3:.1f} ms" for c in old] + ["not run"] * (len(SIZES) - len(old)))
            growth = f"{old[-1] / old[-2]:.1f}x" if len(old) > 1 else "-"
            lines.append(f"| &nbsp;&nbsp;before ({args.before}) | {text} | {growth} |")
        print(lines[-1] if before is None else "\n".join(lines[-2:]), flush=True)
    command = (
        "python3 bench/policy_cost.py"
        + (f" --before {args.before}" if args.before else "")
        + (f" --out {args.out}" if args.out else "")
    )
    report = [
        "# ContentPolicy.decide on adversarial text",
        "",
        f"Command: `{command}` ({run_label()}; one run). Each cell: the best of {args.repeats} calls "
        "(1 for the policy before) of `decide(text, answer)` and `decide(question, text)` together, "
        "the text a unit repeated, then `!`, to the size. Growth: the cost at the largest size over "
        "the cost at a quarter of it (linear: 4x; quadratic: 16x). `re` holds the GIL through a "
        "search: while one text is scanned, nothing else in the process runs.",
        "",
        *lines,
        "",
    ]
    if args.out:
        Path(args.out).write_text("\n".join(report))


if __name__ == "__main__":
    main()
