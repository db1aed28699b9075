"""How often posbench's intervals hold a line's value over many seeds: a coverage study against a
truth the intervals never saw.

    python scripts/seed_coverage.py results/seed_coverage/runs > results/seed_coverage/coverage.md

The runs (``posbench study seed_coverage``: 24 seeds each of a line that holds, alibi, and one
that breaks, sinusoidal, at the zoo_quick budget) are read as the report reads them. Each line's
**truth** at each length is the mean over all its seeds: the mean log perplexity (the report's
``ppl_mean`` is its exp) and the mean per-seed log ratio ppl(L) / ppl(train_len). Then, for k = 2,
3 and 5, ``--draws`` random sets of k seeds per line are reported as ``posbench report`` would
report those k runs (:func:`posbench.report.summary.add_intervals`, the seeds' variance pooled over
the column's lines below 3 seeds), and the script counts how often each interval holds the truth:

* **seeds+text**, the report's interval. It covers a rerun on other text as well as other seeds,
  while the truth here is on this one validation text, so it should hold the truth at least 95%
  of the time: a shortfall means the seeds' term is too narrow.
* **seeds only**, the same cells with their per-token blocks left out (the t interval over seeds):
  the term the 24-seed truth tests sharply, with nothing of the text to hide behind.

**Pairwise decisions.** For each draw and each length past train_len, the verdicts' own decisions
of every pair of lines' ratios (:meth:`posbench.report.verdicts.Verdicts._ratio_signs`: Holm over
the ordering's pairs at 5%) are compared with the truth's order (the difference of the two
24-seed mean log ratios): a decided pair is **wrong** where its direction is the truth's opposite,
and a draw holds a family-wise error where any of its pairs is wrong. A pair whose truth lies
within two of its own standard errors of 0 (the 24-seed means' sd / sqrt(24), combined) has no
clear order: its decisions are counted apart, neither right nor wrong.

The draws share one pool of 24 seeds, so they are not independent. The ± is the binomial error of
``24 // k`` disjoint draws per cell, pooled over the cells counted: a rough bound, wider than the
error over random draws and narrower than a fresh pool of seeds would give. The truth itself is a
24-seed mean, uncertain by about 1/sqrt(24) of one seed's spread: a line whose truth sits near an
interval's end moves the counts.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from posbench.intervals import Cell, Estimator  # noqa: E402
from posbench.report.collect import collect  # noqa: E402
from posbench.report.summary import CELL_COLUMNS, add_intervals, summarize  # noqa: E402
from posbench.report.verdicts import Verdicts, ratio_cell  # noqa: E402

SIZES = (2, 3, 5)
INTERVALS = ["ppl_ci_low", "ppl_ci_high", "ratio_ci_low", "ratio_ci_high"]


def truths(full: pd.DataFrame) -> pd.DataFrame:
    """Per line and length: the mean over every seed of log ppl and of the per-seed log ratio."""
    rows = []
    for label, g in full.groupby("label", sort=False):
        g = g.set_index("eval_len")
        base = g.cell[int(g.train_len.iloc[0])]
        for length, cell in g.cell.items():
            per_seed = ratio_cell(cell, base).nll  # each seed's log ratio, paired by seed as the report pairs them
            rows.append({"label": label, "eval_len": length, "seeds": per_seed.size, "log_ppl": cell.nll.mean(),
                         "log_ratio": float(per_seed.mean()), "seed_sd_ratio": float(per_seed.std(ddof=1))})
    return pd.DataFrame(rows)


def subset(full: pd.DataFrame, chosen: dict[str, np.ndarray], text: bool) -> pd.DataFrame:
    """The summary of ``full`` (cells kept) re-computed for the seeds ``chosen`` per line, with
    (``text``) or without the cells' per-token blocks."""
    cells = []
    for label, cell in zip(full.label, full.cell):
        part = cell.only(np.flatnonzero(np.isin(cell.seeds, chosen[label])))
        cells.append(part if text else Cell(part.seeds, part.nll, None, None, ()))
    base = full.drop(columns=[c for c in [*CELL_COLUMNS, *INTERVALS] if c in full and c != "cell"])
    return base.assign(cell=cells)


def seed_draws(full: pd.DataFrame, draws: int, rng: np.random.Generator):
    """For each size k of :data:`SIZES` below every line's seed count, ``draws`` draws of k seeds a
    line without replacement -> (k, draw, {label: the seeds drawn})."""
    pool = {label: np.array(sorted(set(full.cell[full.label == label].iloc[0].seeds))) for label in full.label.unique()}
    for k in [k for k in SIZES if k < min(map(len, pool.values()))]:
        for draw in range(draws):
            yield k, draw, {label: rng.choice(seeds, size=k, replace=False) for label, seeds in pool.items()}


def coverage(full: pd.DataFrame, truth: pd.DataFrame, draws: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    est = Estimator()
    truth = truth.set_index(["label", "eval_len"])
    rows = []
    for k, _, chosen in seed_draws(full, draws, rng):
        for text in (True, False):
            s = add_intervals(subset(full, chosen, text), est)
            for r in s.itertuples():
                t = truth.loc[(r.label, r.eval_len)]
                hold_ppl = r.ppl_ci_low <= math.exp(t.log_ppl) <= r.ppl_ci_high
                hold_ratio = (r.ratio_ci_low <= math.exp(t.log_ratio) <= r.ratio_ci_high
                              if r.eval_len != r.train_len else math.nan)
                rows.append({"k": k, "interval": "seeds+text" if text else "seeds only", "label": r.label,
                             "eval_len": r.eval_len, "ppl": hold_ppl, "ratio": hold_ratio,
                             "ratio_width": math.log(r.ratio_ci_high / r.ratio_ci_low)
                             if r.eval_len != r.train_len else math.nan})
    return pd.DataFrame(rows)


def decisions(full: pd.DataFrame, truth: pd.DataFrame, draws: int, seed: int) -> pd.DataFrame:
    """Per draw of k seeds a line, length past train_len and pair of lines: the verdicts' decision
    of their ratios and the truth's order (module docstring)."""
    rng = np.random.default_rng(seed + 1)
    est = Estimator()
    t = truth.set_index(["label", "eval_len"])
    rows = []
    for k, draw, chosen in seed_draws(full, draws, rng):
        verdicts = Verdicts(add_intervals(subset(full, chosen, True), est), est)
        for _, g in verdicts.setups():
            tlen = int(g.train_len.iloc[0])
            for length in sorted(x for x in set(g.eval_len) if x > tlen):
                for (a, b), sign in verdicts._ratio_signs(g, length).items():
                    ta, tb = t.loc[(a, length)], t.loc[(b, length)]
                    diff = ta.log_ratio - tb.log_ratio
                    se = math.sqrt(ta.seed_sd_ratio ** 2 / ta.seeds + tb.seed_sd_ratio ** 2 / tb.seeds)
                    clear = abs(diff) > 2 * se
                    rows.append({"k": k, "draw": draw, "eval_len": length, "pair": f"{a} / {b}", "diff": diff,
                                 "se": se, "clear": clear, "decided": sign != "~",
                                 "right": clear and sign == ("<" if diff < 0 else ">"),
                                 "wrong": clear and sign == (">" if diff < 0 else "<")})
    return pd.DataFrame(rows)


def decision_table(d: pd.DataFrame) -> str:
    out = ["| k seeds | pair | L | truth: log ratio difference (se) | decided | right | wrong "
           "| family-wise error at L |", "|---|---|---|---|---|---|---|---|"]
    family = d.groupby(["k", "eval_len", "draw"]).wrong.any().groupby(["k", "eval_len"]).mean()
    for (k, pair, length), g in d.groupby(["k", "pair", "eval_len"], sort=True):
        truth = f"{g['diff'].iloc[0]:+.4f} ({g.se.iloc[0]:.4f})" + ("" if g.clear.iloc[0] else ", no clear order")
        right = f"{g.right.mean():.3f}" if g.clear.iloc[0] else "-"
        wrong = f"{g.wrong.mean():.3f}" if g.clear.iloc[0] else "-"
        out.append(f"| {k} | {pair} | {length} | {truth} | {g.decided.mean():.3f} | {right} | {wrong} | "
                   f"{family[(k, length)]:.3f} |")
    return "\n".join(out)


def table(hits: pd.DataFrame, pool_size: int) -> str:
    out = ["| k seeds | interval | line | ppl at every length | ratio past train_len | ± (rough) |",
           "|---|---|---|---|---|---|"]
    for (k, interval, label), g in hits.groupby(["k", "interval", "label"], sort=False):
        ratio = g.ratio.dropna().astype(float)
        cells = g.groupby("eval_len").ngroups
        n = (pool_size // k) * cells
        p = float(ratio.mean())
        err = math.sqrt(max(p * (1 - p), 0.05 * 0.95) / n)
        out.append(f"| {k} | {interval} | {label} | {g.ppl.astype(float).mean():.3f} | {p:.3f} | {err:.3f} |")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", help="the exported runs (results/seed_coverage/runs)")
    ap.add_argument("--draws", type=int, default=200, help="random sets of k seeds per k (default 200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lines", help="comma-separated lines to read (default: every line of the runs); the seeds' "
                                    "variance below 3 seeds is pooled over the lines read, as a report pools it")
    args = ap.parse_args(argv)
    full = summarize(collect([args.runs]), cells=True)
    if args.lines:
        full = full[full.label.isin(args.lines.split(","))].reset_index(drop=True)
    truth = truths(full)
    pool_size = int(truth.seeds.min())
    hits = coverage(full, truth, args.draws, args.seed)
    print(f"# Interval coverage against a {pool_size}-seed truth\n")
    lines = f" --lines {args.lines}" if args.lines else ""
    print(f"`python scripts/seed_coverage.py {args.runs} --draws {args.draws} --seed {args.seed}{lines}`: each line's "
          f"truth is the mean over its {pool_size} seeds; {args.draws} random sets of k seeds per k, each reported "
          "as posbench reports k runs; the share of intervals (95%) that hold the truth, over every length "
          "(ratios: past train_len).\n")
    print(table(hits, pool_size))
    decided = decisions(full, truth, args.draws, args.seed)
    print(f"\nPairwise decisions of the ratios ({args.draws} draws per k; the share of draws in which the verdicts "
          "decide the pair, decide it in the truth's order, or in the opposite one; family-wise: the share of draws "
          "with any wrong decision at that length):\n")
    print(decision_table(decided))
    print("\nTruth per line (log ratio's seed-to-seed sd beside it):\n")
    print("| line | L | ppl (geometric mean) | ratio | one seed's sd of the log ratio |\n|---|---|---|---|---|")
    for r in truth.itertuples():
        print(f"| {r.label} | {r.eval_len} | {math.exp(r.log_ppl):.2f} | {math.exp(r.log_ratio):.4f} | "
              f"{r.seed_sd_ratio:.4f} |")


if __name__ == "__main__":
    main()
