"""Coverage of the report's 95% intervals by simulation, at the headline's seed-to-text variance ratio.

    python scripts/interval_coverage.py                      # writes results/intervals/coverage.{md,csv}
    python scripts/interval_coverage.py --replicates 400 --out /tmp/cov   # a quick look

What a report's interval must cover is the expectation over seeds *and* texts (posbench.intervals).
This script measures how often it does, for the three intervals a report prints - a cell (ppl of a
line at one length), a line's ratio ppl(16x) / ppl(1x), and two lines' difference (the bold and
``vs_best``) - with k = 2 and 3 seeds, with the seed term as the report builds it now (a line below
3 seeds takes at least the column's pooled seed variance, :func:`posbench.intervals.seed_term`) and
without the pool (each line's own seeds only, the estimator before), side by side.

**The simulated report.** Each replicate is one report of ``LINES`` lines (the headline's five),
each trained with k seeds and scored on one shared text of 20 bootstrap blocks: block b's mean
NLL for seed s of line j at length L is mu_jL + u_js(L) + t_b + e_jsb (u: the seed's effect, with
a per-seed part of the ratio; t: the text's, shared by every line and length; e: their interplay).
The sizes of the seed and text terms are the headline's own (results/baselines/headline, three
seeds a line, read here at run time): at 1x and at 16x, the median over its lines of the seeds'
variance of the mean NLL and of the text's bootstrap variance; ``--heterogeneous`` gives each
line its own seed sd, the headline's five per-line values (the pooled term assumes the lines of a
column vary alike; this is the case where they do not).

**Its own error.** A replicate's hits are correlated (the lines share a text), so the standard
error of a coverage is the sd of the per-replicate hit rates / sqrt(replicates), printed beside
it; the default 4,000 replicates keep it below 0.005 at coverages near 0.95.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from posbench.intervals import BLOCKS, Cell, Estimator, pool_seeds
from posbench.report.collect import collect
from posbench.report.summary import _cells, summarize

HEADLINE = Path("results/baselines/headline")
LINES = 5
INTERVALS = ("cell", "ratio", "lines")


def headline_scales(root: Path = HEADLINE) -> dict[str, np.ndarray]:
    """Per line of the headline: the seeds' sd (per seed, log scale) at 1x and of the 16x log ratio,
    and the text's bootstrap sd of the mean NLL at 1x and of the paired log ratio."""
    df = collect([root])
    df = df[(df["mode"] == "nonoverlapping") & (df.rope_scaling == "none")]
    summary = summarize(df)
    cells = dict(zip(zip(summary.encoding, summary.eval_len), _cells(df)))  # GROUP order is summary's
    train, longest = int(df.train_len.min()), int(df.eval_len.max())
    est = Estimator()
    out = {"seed_1x": [], "seed_ratio": [], "text_1x": [], "text_ratio": []}
    for enc in sorted(df.encoding.unique()):
        base, far = cells[(enc, train)], cells[(enc, longest)]
        out["seed_1x"].append(float(np.std(base.nll, ddof=1)))
        out["seed_ratio"].append(float(np.std(far.nll - base.nll, ddof=1)))
        out["text_1x"].append(float(np.std(est._boot(base), ddof=1)))
        out["text_ratio"].append(float(np.std(est._boot(far) - est._boot(base), ddof=1)))
    return {k: np.asarray(v) for k, v in out.items()}


def simulate_report(rng, k: int, seed_1x: np.ndarray, seed_ratio: np.ndarray, text_1x: float, text_ratio: float,
                    n_blocks: int = BLOCKS, block_tokens: int = 100):
    """One report: per line, its 1x cell and its 16x cell (truths 4.0 + 0.1 j and that + 0.5)."""
    t = rng.normal(0, text_1x * math.sqrt(n_blocks), n_blocks)           # the shared text at 1x
    dt = rng.normal(0, text_ratio * math.sqrt(n_blocks), n_blocks)       # how the text moves the 16x loss
    sizes = np.full(n_blocks, block_tokens)
    lines = []
    for j in range(len(seed_1x)):
        u = rng.normal(0, seed_1x[j], k)
        du = rng.normal(0, seed_ratio[j], k)
        e = rng.normal(0, 0.2 * seed_1x[j] + 1e-3, (2, k, n_blocks))
        base = (4.0 + 0.1 * j + u[:, None] + t[None, :] + e[0]) * sizes
        far = (4.5 + 0.1 * j + (u + du)[:, None] + (t + dt)[None, :] + e[1]) * sizes
        lines.append(tuple(Cell(np.arange(k), b.sum(1) / sizes.sum(), b, sizes, ("sim",)) for b in (base, far)))
    return lines


def replicate_hits(est: Estimator, lines, pooled: bool) -> dict[str, float]:
    """The fraction of each kind of interval in one simulated report that holds its truth."""
    cell_pool = pool_seeds(b.nll for b, _ in lines) if pooled else None
    ratio_pool = pool_seeds(f.nll - b.nll for b, f in lines) if pooled else None
    hits = {name: [] for name in INTERVALS}
    for j, (base, far) in enumerate(lines):
        c = est.cell(base, cell_pool)
        hits["cell"].append(c.low <= 4.0 + 0.1 * j <= c.high)
        r = est.difference(far, base, same_models=True, pools=(ratio_pool, None))
        hits["ratio"].append(r.low <= 0.5 <= r.high)
        if j:  # every line against the first, as vs_best compares with the lowest
            d = est.difference(base, lines[0][0], pools=(cell_pool, cell_pool))
            hits["lines"].append(d.low <= 0.1 * j <= d.high)
    return {name: float(np.mean(h)) for name, h in hits.items()}


def coverage(scales: dict, k: int, replicates: int, heterogeneous: bool, seed: int = 0, resamples: int = 1000):
    rng = np.random.default_rng([seed, k, int(heterogeneous)])
    est = Estimator(resamples=resamples)
    if heterogeneous:
        seed_1x, seed_ratio = scales["seed_1x"], scales["seed_ratio"]
    else:
        seed_1x = np.full(LINES, np.median(scales["seed_1x"]))
        seed_ratio = np.full(LINES, np.median(scales["seed_ratio"]))
    text_1x, text_ratio = float(np.median(scales["text_1x"])), float(np.median(scales["text_ratio"]))
    rows = {pooled: {name: [] for name in INTERVALS} for pooled in (True, False)}
    for _ in range(replicates):
        lines = simulate_report(rng, k, seed_1x, seed_ratio, text_1x, text_ratio)
        for pooled in (True, False):
            for name, h in replicate_hits(est, lines, pooled).items():
                rows[pooled][name].append(h)
    out = []
    for pooled, by_name in rows.items():
        for name, h in by_name.items():
            h = np.asarray(h)
            out.append({"seeds": k, "lines": "heterogeneous" if heterogeneous else "alike",
                        "seed term": "pooled below 3 seeds" if pooled else "own seeds only", "interval": name,
                        "coverage": h.mean(), "mc_se": h.std(ddof=1) / math.sqrt(h.size), "replicates": h.size})
    return out


def markdown(wide: pd.DataFrame) -> str:
    head = list(wide.index.names) + list(wide.columns)
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows += ["| " + " | ".join(map(str, (*key, *vals))) + " |" for key, vals in zip(wide.index, wide.to_numpy())]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=4000)
    parser.add_argument("--out", default="results/intervals")
    ns = parser.parse_args(argv)
    scales = headline_scales()
    rows = []
    for heterogeneous in (False, True):
        for k in (2, 3):
            rows += coverage(scales, k, ns.replicates, heterogeneous)
            print(pd.DataFrame(rows[-6:]).to_string(index=False), flush=True)
    table = pd.DataFrame(rows)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "coverage.csv", index=False)
    wide = table.assign(cov=[f"{c:.3f} ± {s:.3f}" for c, s in zip(table.coverage, table.mc_se)]).pivot_table(
        index=["lines", "seeds", "seed term"], columns="interval", values="cov", aggfunc="first")[list(INTERVALS)]
    scale_text = ", ".join(f"{k} " + "/".join(f"{v:.4f}" for v in vals) for k, vals in scales.items())
    (out / "coverage.md").write_text(
        "# Coverage of the report's 95% intervals (simulation)\n\n"
        f"Command: `python scripts/interval_coverage.py --replicates {ns.replicates}`\n\n"
        f"Scales from {HEADLINE} (per line, log scale, sd): {scale_text}.\n\n"
        "Each cell: the fraction of intervals holding their truth ± its Monte Carlo standard error, over "
        f"{ns.replicates:,} simulated reports of {LINES} lines (scripts/interval_coverage.py's docstring).\n\n"
        + markdown(wide) + "\n")
    print(f"wrote {out / 'coverage.md'}, {out / 'coverage.csv'}")


if __name__ == "__main__":
    main()
