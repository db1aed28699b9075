"""``posbench report DIRS``: the tables and figures of many run dirs (:mod:`posbench.report` draws
them), or ``--export-baseline`` to keep what paired intervals need of them."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import PosbenchError

HELP = "gather results.csv (and tasks.csv) files under run/sweep dirs into tables and figures"


def parser() -> argparse.ArgumentParser:
    """``posbench report``'s options."""
    from ..report.baselines import shipped_baselines
    from ..report.build import REFERENCE

    parser = argparse.ArgumentParser(prog="posbench report", description=HELP)
    parser.add_argument("dirs", nargs="+", help="run dirs, sweep dirs, results.csv or tasks.csv files")
    parser.add_argument("--out", help="where the report files go (default: the single dir given, else ./report)")
    parser.add_argument("--format", default="md", choices=["md", "latex"],
                        help="table printed: Markdown (default) or LaTeX/booktabs (also written as report.tex)")
    scale = parser.add_mutually_exclusive_group()
    scale.add_argument("--log-y", action="store_true",
                       help="log-scale perplexity axes (the default: a line far above the others, sinusoidal at "
                            "16x, leaves the rest readable)")
    scale.add_argument("--linear-y", action="store_true", help="linear perplexity axes instead")
    ref = parser.add_mutually_exclusive_group()
    ref.add_argument("--reference", default="auto", metavar="PATH",
                     help="published results (encoding,train_len,eval_len,ppl) drawn beside ours "
                          f"(default: {REFERENCE} when it exists)")
    ref.add_argument("--no-reference", action="store_true", help="leave out the published-results panel")
    parser.add_argument("--by", action="append", default=[], metavar="KEY",
                        help="a dotted config key (e.g. encoding.bias_scale, train.steps) whose value joins each "
                             "line's label, so runs that differ in it are lines of their own; dir: the path given "
                             "that holds each run (the same configs from two places); repeat or comma-separate")
    parser.add_argument("--baseline", action="append", default=[], metavar="NAME|DIR",
                        help="shipped runs reported beside yours with paired intervals, without retraining them: "
                             f"a shipped baseline ({', '.join(shipped_baselines()) or 'none shipped'}) or a folder "
                             "made by --export-baseline; repeatable")
    parser.add_argument("--threshold", type=float, default=None, metavar="SCORE",
                        help="the score in [0, 1] a probe's effective length keeps at every length up to it "
                             "(RULER's rule; default 0.5)")
    parser.add_argument("--lines", action="append", default=[], metavar="NAMES",
                        help="the lines the per-line figures (report.png, positions, training) draw, comma-separated "
                             "as the table or legend names them (default: all up to 8 lines; past 8, the report "
                             "draws ranked.png and tradeoff.png of every line and picks the best, the worst and the "
                             "baselines)")
    parser.add_argument("--mix", action="store_true",
                        help="report runs scored on different text (corpus, split, vocabulary, scored tokens) "
                             "together, each text's lines apart (default: refuse, naming what differs)")
    parser.add_argument("--missing-contrasts", action="store_true",
                        help="a --contrast line that is not in the report is said to be missing instead of refused "
                             "(posbench study passes it: a study reported before all its runs exist)")
    parser.add_argument("--contrast", action="append", default=[], metavar="A/B",
                        help="a verdict comparing line A's ppl(L) / ppl(train_len) with line B's, both named as the "
                             "table names them (repeatable)")
    parser.add_argument("--per", action="append", default=[], metavar="KEY",
                        help="a --by key whose values split the verdicts instead of naming lines: the lines are "
                             "ordered within each value (a budget study: per train.steps) and the across-setups "
                             "verdicts say which orders hold at every value; repeat or comma-separate for several")
    parser.add_argument("--matched", action="store_true",
                        help="also matched.md/.csv: each line's ppl(16x) / ppl(1x) at the budget where its ppl at "
                             "train_len reaches a common target (runs of each line at several train.steps; "
                             "posbench/report/matched.py)")
    parser.add_argument("--target", type=float, default=None, metavar="PPL",
                        help="--matched: the ppl at train_len to match (default: the worst line's at its largest "
                             "budget)")
    parser.add_argument("--export-baseline", metavar="OUT",
                        help="instead of a report, write what paired intervals need of the runs under DIRS "
                             "(results, config, per-block NLL sums: a few KiB per run) to OUT")
    return parser


def main(args: list[str]) -> None:
    from ..report.baselines import export_baseline, resolve_baseline
    from ..report.build import ReportOptions, report
    from ..report.probes import THRESHOLD

    ns = parser().parse_args(args)
    if ns.export_baseline:
        written = export_baseline(ns.dirs, ns.export_baseline)
        print(f"wrote {len(written)} run(s) to {ns.export_baseline}: posbench report <your runs> "
              f"--baseline {ns.export_baseline}")
        return
    by = [k for arg in ns.by for k in arg.split(",") if k]
    threshold = THRESHOLD if ns.threshold is None else ns.threshold
    if not 0 <= threshold <= 1:
        raise PosbenchError(f"report: --threshold {threshold:g} is not valid; valid: a score in [0, 1], e.g. 0.5")
    baselines = [str(resolve_baseline(b)) for b in ns.baseline]
    contrasts = _contrasts(ns)
    if ns.matched and "train.steps" not in by:
        by.append("train.steps")  # each budget a line of the usual report
    per = _per(ns, by)
    matched = _matched_parts(ns, baselines) if ns.matched else None  # refused before any file is written
    reference = None if ns.no_reference else ns.reference
    options = ReportOptions(fmt=ns.format, log_y=not ns.linear_y, reference=reference, by=by, baselines=baselines,
                            threshold=threshold, mix=ns.mix, lines=ns.lines, contrasts=contrasts, per=per,
                            strict_contrasts=not ns.missing_contrasts)
    done = report(ns.dirs, ns.out, options)
    if ns.matched:
        done = _matched(ns, done, baselines, matched)
    if done.header:
        print(done.header + "\n")
    if done.table:
        print(done.table)
        print("\n" + "\n".join(done.text))
    if done.tasks is not None:
        print(("\n" if done.table else "") + done.tasks.table)
    print(f"\nwrote {', '.join(map(str, done.files))}")


def _per(ns, by: list[str]) -> list[str]:
    """--per keys, each one of ``by``'s."""
    per = [k for arg in ns.per for k in arg.split(",") if k]
    if bad := [k for k in per if k not in by]:
        valid = ", ".join(by) if by else "a key also given to --by, e.g. --by train.steps --per train.steps"
        raise PosbenchError(f"report: --per {bad[0]} is not a --by key; valid: {valid}")
    return per


def _contrasts(ns) -> list[str]:
    """--contrast A/B texts (the report cuts each at the '/' between two of its line names, since a
    name may hold one: posbench.report.verdicts.split_contrast), and --target's check (it needs
    --matched)."""
    contrasts = list(ns.contrast)
    if bad := [c for c in contrasts if not any(c[:i] and c[i + 1:] for i, ch in enumerate(c) if ch == "/")]:
        raise PosbenchError(f"report: --contrast {bad[0]!r} is not valid; valid: A/B, two line names as the table "
                            "names them, e.g. 'p_rope/rope'")
    if ns.target is not None and not (ns.matched and ns.target > 0):
        raise PosbenchError(f"report: --target {ns.target:g} is not valid; valid: a perplexity > 0, with --matched")
    return contrasts


def _matched_parts(ns, baselines: list[str]):
    """--matched's table and verdicts (posbench.report.matched.matched_parts), or its one line."""
    from ..report.collect import collect
    from ..report.matched import matched_parts

    return matched_parts(collect(list(ns.dirs) + baselines), ns.target)


def _matched(ns, done, baselines: list[str], parts):
    """matched.md and matched.csv beside the report (posbench.report.matched); -> ``done`` with them."""
    from ..report.matched import write_matched

    out = Path(done.files[0]).parent
    written = write_matched(None, out, ns.target, parts)
    print((out / "matched.md").read_text())
    return done._replace(files=done.files + written)
