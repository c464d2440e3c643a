"""The false-hit benchmark: what a threshold serves, and what the verifier saves.

Two measurements, over public labelled data (see ``data/SOURCES.md`` in the project's shared
folder):

* **Pairs** (``a``, ``b``, ``label``; 1 = same meaning). ``a`` plays the cached prompt and ``b``
  the new one. A pair is *served* when its cosine similarity is at or above the threshold and,
  in the guarded mode, the verifier accepts it. False-hit rate = served label-0 pairs / label-0
  pairs; hit rate = served label-1 pairs / label-1 pairs. The near-miss subset (label 0 with
  word-set Jaccard >= 0.8) is reported on its own: it is what similarity cannot see.
* **Replay** over an intent file (``text``, ``label``): the first half of each intent's queries
  fill a real ``SemanticCache``; the other half are asked. A served answer from another intent
  is a wrong answer.

Each file is embedded in one batch, once; every threshold then reuses the vectors. Texts are
used as given (PAWS is tokenised, "do n't"; the verifier's tokenizer copes, nothing is
normalised beforehand).

The parts: labelled_pairs.py (reading the files, the halves, the sweep and the replay), this
module (the report, the plot and the command):

    python3 bench/false_hits.py PAIRS.jsonl [...] [--held-apart PAIRS.jsonl ...]
        [--replay INTENTS.jsonl] [--half report|tune|all] [--out REPORT.md]

(Before it moved out of the package this was ``gpucache eval``; the committed report says so.)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from labelled_pairs import NEAR_MISS_JACCARD, THRESHOLDS, PairResult, ReplayPoint
from provenance import run_label

from gpucache.guard.lexical import LexicalNearMissVerifier


def render_report(
    results: Sequence[PairResult],
    replay: Sequence[ReplayPoint],
    *,
    threshold: float,
    top_k: int,
    command: str,
    about: str,
    plot: str | None,
    half: str = "all",
) -> str:
    """The markdown report: per-file tables, the default's figures, dominance, replay."""
    out = ["# Semantic false hits", "", about, "", f"Reproduce: `{command}`", ""]
    if half != "all":
        out += [
            f"Every file is measured on its **{half} half** only: each row falls in the tuning "
            "or the report half by a keyed hash of its id (`half_of` "
            "in bench/labelled_pairs.py). The verifier's rules, word lists and table and the "
            "defaults were tuned on the tuning half (`bench/guard_tuning.py`). The report half "
            "is not strictly out of sample: earlier rounds read its figures while the rules "
            "changed. Only the files marked *held apart* (never used for tuning, measured whole) "
            "and the blind exams (`bench/reports/guard-exam-3.md`, the latest) are.",
            "",
        ]
    out += [
        "A pair is served when its cosine similarity is at or above the threshold and, with the",
        "verifier, `LexicalNearMissVerifier` accepts it (`a` plays the cached prompt, `b` the new",
        "one). False hits = served label-0 pairs / label-0 pairs; hits = served label-1 pairs /",
        f"label-1 pairs; near-miss = label-0 pairs with word-set Jaccard >= {NEAR_MISS_JACCARD}.",
        "Texts are used as given (PAWS stays tokenised).",
        "",
        f"## At the defaults (threshold {threshold}, top_k {top_k})",
        "",
        "| set | pairs | threshold only: false hits / hits | with verifier: false hits / hits "
        "| near-miss false hits (only / verifier) | threshold-only at the same hit rate: "
        "threshold, false hits | ratio | verify median |",
        "|---|---:|---|---|---|---|---:|---:|",
    ]
    for r in results:
        plain, guarded = r.rates(threshold, False), r.rates(threshold, True)
        t_eq, fh_eq = r.threshold_only_at_hit_rate(guarded.hit)
        ratio = r.dominance(threshold)
        out.append(
            f"| {r.name} | {r.pairs} | {plain.false_hit:.1%} / {plain.hit:.1%} | "
            f"{guarded.false_hit:.1%} / {guarded.hit:.1%} | {plain.near_miss_false_hit:.1%} / "
            f"{guarded.near_miss_false_hit:.1%} (of {r.near_misses}) | {t_eq:.3f}, "
            f"{fh_eq:.1%} | {ratio:.2f}x | {r.verify_us_cold:.0f} / {r.verify_us_warm:.0f} us |"
        )
    out += [
        "",
        "ratio = threshold-only false hits / verifier false hits at the same hit rate "
        "(above 1: the verifier buys fewer false hits than a higher threshold would). "
        "verify: median microseconds per call, cold = neither prompt parsed before, warm = "
        "the cached prompt parsed before (as in a running cache).",
        "",
    ]
    out += _kinds_section(results, threshold)
    out += _rule_yield_section(results, threshold)
    out += _ablation_section(results, threshold)
    for r in results:
        out += [
            f"## {r.name}: by threshold",
            "",
            "| threshold | only: false hits | only: hits | verifier: false hits | "
            "verifier: hits | near-miss: only | near-miss: verifier |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for t in THRESHOLDS:
            p, g = r.rates(t, False), r.rates(t, True)
            out.append(
                f"| {t:g} | {p.false_hit:.1%} | {p.hit:.1%} | {g.false_hit:.1%} | "
                f"{g.hit:.1%} | {p.near_miss_false_hit:.1%} | {g.near_miss_false_hit:.1%} |"
            )
        rules = ", ".join(f"{k} {v}" for k, v in sorted(r.rejected_by_rule.items(), key=lambda kv: -kv[1]))
        out += ["", f"Verifier rejections over all {r.pairs} pairs, by rule: {rules or 'none'}.", ""]
    if replay:
        out += [
            "## Intent replay",
            "",
            "Half of each intent's queries fill a real `SemanticCache`; the other half ask. "
            "Wrong = served an answer stored for another intent.",
            "",
            "| threshold | top_k | verifier | asked | served (hit rate) | wrong / served |",
            "|---:|---:|---|---:|---:|---:|",
        ]
        for point in replay:
            out.append(
                f"| {point.threshold:g} | {point.top_k} | "
                f"{'yes' if point.guarded else 'no'} | {point.asked} | {point.served} "
                f"({point.hit_rate:.1%}) | {point.wrong} ({point.wrong_share:.1%}) |"
            )
        out.append("")
    if plot:
        out += [f"![hit rate against false-hit rate]({plot})", ""]
    return "\n".join(out)


def _kinds_section(results: Sequence[PairResult], threshold: float) -> list[str]:
    """For files whose pairs name their kind (the LLM-prompt sets): how many of each kind
    are served, by similarity alone and with the verifier, and the rule that refused most."""
    out: list[str] = []
    for r in results:
        kinds = sorted(set(r.kinds) - {""})
        if not kinds:
            continue
        out += [
            f"## {r.name}: by kind of pair (threshold {threshold})",
            "",
            "| kind | label | pairs | served by threshold only | served with verifier | rejected by |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for kind in kinds:
            rows = [i for i, k in enumerate(r.kinds) if k == kind]
            above = [i for i in rows if r.similarity[i] >= threshold]
            served = [i for i in above if r.accepted[i]]
            rules: dict[str, int] = {}
            for i in above:
                if not r.accepted[i]:
                    rules[r.rule[i]] = rules.get(r.rule[i], 0) + 1
            shown = ", ".join(f"{k} {v}" for k, v in sorted(rules.items(), key=lambda kv: -kv[1]))
            label = r.labels[rows[0]]
            out.append(f"| {kind} | {label} | {len(rows)} | {len(above)} | {len(served)} | {shown or '-'} |")
        out.append("")
    return out


def _rule_yield_section(results: Sequence[PairResult], threshold: float) -> list[str]:
    """What each rule stops at the default threshold, against what a higher threshold stops
    for the same hits: the evidence for keeping a rule, file by file."""
    out = [
        f"## What each rule stops at threshold {threshold}",
        "",
        "Pairs at or above the threshold that a rule rejected, as label-0 (false hits "
        "prevented) / label-1 (hits lost). The last column is what raising the threshold "
        "to the same hit rate stops instead: a rule whose label-0 share is higher than that "
        "band's earns its place on that file; one whose share is lower acts worse than a "
        "higher threshold there.",
        "",
    ]
    names = sorted({k for r in results for k in r.rule_yield(threshold)})
    out += [
        "| set | " + " | ".join(names) + " | threshold raised to the same hit rate |",
        "|---|" + "---:|" * (len(names) + 1),
    ]
    for r in results:
        got = r.rule_yield(threshold)
        t_eq, _ = r.threshold_only_at_hit_rate(r.rates(threshold, True).hit)
        band = r.threshold_yield(threshold, t_eq)
        cells = [f"{got[n][0]} / {got[n][1]}" if n in got else "-" for n in names]
        out.append(
            f"| {r.name} | " + " | ".join(cells) + f" | {band[0]} / {band[1]} ({threshold:g} to {t_eq:.3f}) |"
        )
    return out + [""]


def _ablation_section(results: Sequence[PairResult], threshold: float) -> list[str]:
    """The default against the verifier with one rule off (or only the founding rules), file by
    file: the evidence a deployment needs to switch a rule off, and the limits of the rules."""
    with_ablation = [r for r in results if r.ablation]
    if not with_ablation:
        return []
    out = [
        f"## Each rule switched off (threshold {threshold})",
        "",
        "Guarded false hits / hits, and the ratio to threshold-only at the same hit rate, "
        "with one rule switched off (`LexicalNearMissVerifier(skip=(rule,))`), without the "
        "table of interchangeable words (`table=False`), or with every addition off (the "
        "founding rules alone, without the table). A rule whose removal raises a file's ratio "
        "acts worse than a higher threshold on that file.",
        "",
        "| verifier | " + " | ".join(r.name for r in with_ablation) + " |",
        "|---|" + "---|" * len(with_ablation),
    ]
    variants: list[tuple[str, dict[str, list[bool]]]] = [("all rules (the default)", {})]
    variants += [(v, {r.name: r.ablation[v] for r in with_ablation}) for v in with_ablation[0].ablation]
    for label, accepted in variants:
        cells = []
        for r in with_ablation:
            answers = accepted.get(r.name)
            g = r.rates(threshold, True, answers)
            cells.append(f"{g.false_hit:.1%} / {g.hit:.1%}, {r.dominance(threshold, answers):.2f}x")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out + [""]


def plot_curves(results: Sequence[PairResult], path: str | Path) -> bool:
    """Hit rate against false-hit rate over the thresholds, both modes; False without
    matplotlib (the ``bench`` extra)."""
    from plotting import headless_pyplot

    plt = headless_pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 4), squeeze=False)
    for ax, r in zip(axes[0], results):
        for guarded, style in ((False, "o--"), (True, "s-")):
            pts = [r.rates(t, guarded) for t in THRESHOLDS]
            ax.plot(
                [p.false_hit for p in pts],
                [p.hit for p in pts],
                style,
                label="threshold + verifier" if guarded else "threshold only",
                markersize=3,
            )
        ax.set_title(r.name)
        ax.set_xlabel("false-hit rate")
        ax.set_ylabel("hit rate")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import shlex
    import sys

    import transformers
    from labelled_pairs import evaluate_pairs, replay_intents
    from transformers.utils import logging as hf_logging

    from gpucache import TransformerEmbedder
    from gpucache.cache.settings import DEFAULT_THRESHOLD, DEFAULT_TOP_K
    from gpucache.index.blas_pool import quiet_blas_pool

    parser = argparse.ArgumentParser(description="false-hit benchmark over labelled pairs and intents")
    parser.add_argument("pairs", nargs="*", help="JSONL files of {a, b, label} pairs")
    parser.add_argument("--replay", default=None, help="JSONL file of {text, label} intent queries")
    parser.add_argument(
        "--half",
        default="report",
        choices=["report", "tune", "all"],
        help="which half of each file to measure (default: report, the half no rule or default was tuned on)",
    )
    parser.add_argument(
        "--held-apart",
        nargs="*",
        default=[],
        metavar="PAIRS",
        help="JSONL pair files kept apart from all tuning, measured whole",
    )
    parser.add_argument(
        "--out",
        default="bench/reports/semantic-false-hits.md",
        help="report path (a PNG plot is written beside it)",
    )
    parser.add_argument("--device", default="auto", help="auto (default), cpu or cuda[:N]")
    args = parser.parse_args(argv)
    quiet_blas_pool()
    hf_logging.disable_progress_bar()
    embedder = TransformerEmbedder(device=args.device)
    verifier = LexicalNearMissVerifier()
    results = []
    for path, half in [(p, args.half) for p in args.pairs] + [(p, "all") for p in args.held_apart]:
        started = time.perf_counter()
        name = Path(path).stem + (" (held apart)" if half == "all" and args.half != "all" else "")
        results.append(evaluate_pairs(path, embedder, verifier, name=name, half=half))
        print(f"{path}: {results[-1].pairs} pairs in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    replay = []
    if args.replay:
        grid = sorted({0.80, 0.85, DEFAULT_THRESHOLD, 0.90})
        settings = [(t, 1, g) for t in grid for g in (False, True)]
        settings += [(DEFAULT_THRESHOLD, k, True) for k in (2, 4)]
        replay = replay_intents(args.replay, embedder, verifier, settings, half=args.half)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot = out.with_suffix(".png")
    plotted = plot_curves(results, plot) if results else False
    about = (
        f"Model {embedder.name} on {embedder.device} ({embedder.dtype}"
        + (f", matmuls in {embedder.autocast_dtype}" if embedder.autocast_dtype else "")
        + f"); transformers {transformers.__version__}; verifier {verifier.name}; {run_label(embedder)}."
    )
    command = "python3 bench/false_hits.py " + " ".join(shlex.quote(str(p)) for p in args.pairs)
    if args.held_apart:
        command += " --held-apart " + " ".join(shlex.quote(str(p)) for p in args.held_apart)
    if args.replay:
        command += f" --replay {shlex.quote(str(args.replay))}"
    if args.half != "report":
        command += f" --half {args.half}"
    command += f" --out {shlex.quote(str(args.out))}"
    text = render_report(
        results,
        replay,
        threshold=DEFAULT_THRESHOLD,
        top_k=DEFAULT_TOP_K,
        command=command,
        about=about,
        plot=plot.name if plotted else None,
        half=args.half,
    )
    out.write_text(text, encoding="utf-8")
    print(text)
    print(f"wrote {out}" + (f" and {plot}" if plotted else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
