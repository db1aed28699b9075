"""The budget study's table and figure, from the runs of `posbench study budget_study` (conf/study/budget_study.yaml).

    python scripts/budget_table.py outputs/budget_study --out results/budget_study

Each run is placed by its config.yaml: its budget (train.steps x train.batch_size x
train.train_len training tokens) and its line, the encoding, with T5's unscaled form
(encoding.bias_scale=none) as a line of its own, ``t5 (unscaled)``. Seeds are averaged as
`posbench report` averages them, with the same 95% intervals (the seeds' spread and the text's,
posbench/intervals.py).

Writes into --out:
  budget.csv  tidy: line, seed ('mean' for the average over seeds), steps, train_tokens,
              train_len, eval_len, ppl with its interval, the ratio ppl(eval_len) / ppl(train_len) with its
              paired interval, vs_best (ppl over the lowest line's at the same budget and eval_len, with
              its paired interval), the interval's method;
  budget.md   per budget: ppl at train_len per line, their spread (the worst line's ppl over the
              best's, with its paired interval) and whether that interval puts them within 5% of
              each other, the 16x ratios with their intervals, and the ordering of the lines by the
              16x ratio where the intervals of neighbours do not overlap;
  budget.png  (and .svg) two panels against training tokens (log x): ppl at train_len, and
              ppl(16x) / ppl(1x); one line per encoding through the mean over seeds, with its 95%
              interval, and each seed's own value as a dash. The line's point is the mean of the
              seeds' values and the interval is about their geometric mean over the scored tokens,
              so where two seeds disagree the point can lie outside its interval (the bar then ends
              at the point): the dashes show why.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from posbench.report.collect import collect
from posbench.report.figures import save
from posbench.report.summary import summarize
from posbench.runs.rundir import atomic_write_text

COLUMNS = ["line", "seed", "steps", "train_tokens", "train_len", "eval_len", "ppl", "ppl_ci_low", "ppl_ci_high", "ratio",
           "ratio_ci_low", "ratio_ci_high", "vs_best", "vs_best_ci_low", "vs_best_ci_high", "ci_method"]
PARITY = 1.05  # "within 5%": the parity criterion for ppl at train_len
NOTE = ("Cells: the mean over seeds [95% interval over the scored tokens] (each seed's value); spread: the "
        "highest ppl at train_len over the lowest, paired; within 5%?: 'yes' where the spread's whole interval "
        "and every seed's own spread are at most 1.05, 'no' where all lie above, else 'not distinguishable'; "
        "in the ordering '<' where neighbours' intervals are apart and their seeds do not overlap, '~' otherwise.")


def place(run: str) -> tuple[str, int, int]:
    """(line, steps, training tokens) of a run dir, from its config.yaml."""
    cfg = OmegaConf.load(Path(run) / "config.yaml")
    line = str(cfg.encoding.name)
    if line == "t5" and cfg.encoding.get("bias_scale", "sqrt_head_dim") == "none":
        line = "t5 (unscaled)"
    steps = int(cfg.train.steps)
    return line, steps, steps * int(cfg.train.batch_size) * int(cfg.train.train_len)


def tidy(summary: pd.DataFrame, seed) -> pd.DataFrame:
    steps = summary.variant.astype(int)
    return pd.DataFrame({"line": summary.encoding, "seed": seed, "steps": steps,
                         "train_tokens": summary.train_tokens, "train_len": summary.train_len, "eval_len": summary.eval_len, "ppl": summary.ppl_mean,
                         "ppl_ci_low": summary.ppl_ci_low, "ppl_ci_high": summary.ppl_ci_high,
                         "ratio": summary.ratio_mean, "ratio_ci_low": summary.ratio_ci_low,
                         "ratio_ci_high": summary.ratio_ci_high, "vs_best": summary.vs_best,
                         "vs_best_ci_low": summary.vs_best_ci_low, "vs_best_ci_high": summary.vs_best_ci_high,
                         "ci_method": summary.ci_method})


def budget_frame(dirs: list[str]) -> pd.DataFrame:
    """The tidy table: every (line, steps, eval_len) over all seeds ('mean'), and each seed alone."""
    df = collect(dirs)
    df = df[(df.rope_scaling == "none") & (df["mode"] == "nonoverlapping")]
    placed = {run: place(run) for run in df.run.unique()}
    df = df.assign(encoding=df.run.map(lambda r: placed[r][0]), variant=df.run.map(lambda r: str(placed[r][1])))
    tokens = {str(steps): n for _, steps, n in placed.values()}
    parts = []
    for seed, rows in [("mean", df), *df.groupby("seed")]:
        # one budget at a time, so that vs_best compares the lines of one budget, not all of them
        s = pd.concat([summarize(g) for _, g in rows.groupby("variant")], ignore_index=True)
        parts.append(tidy(s.assign(train_tokens=s.variant.map(tokens)), seed))
    out = pd.concat(parts, ignore_index=True)
    return out.sort_values(["line", "seed", "steps", "eval_len"], key=lambda c: c.astype(str) if c.name == "seed"
                           else c).reset_index(drop=True)[COLUMNS]


def _interval(mean, low, high, digits: int) -> str:
    if mean != mean:
        return "n/a"
    return f"{mean:.{digits}f}" + ("" if low != low else f" [{low:.{digits}f}, {high:.{digits}f}]")


def at_multiple(rows: pd.DataFrame, multiple: int) -> pd.DataFrame:
    """The rows evaluated at ``multiple`` x train_len."""
    return rows[rows.eval_len == multiple * rows.train_len]


def summary_markdown(frame: pd.DataFrame) -> str:
    """Two tables, one row per budget. In distribution: every line's ppl at train_len, the spread
    (the worst line over the best) with its interval and each seed's own spread, and the within-5%
    verdict. Extrapolation: every line's ppl(16x) / ppl(1x) with its interval and each seed's
    ratio, and the lines ordered by it. With two seeds the intervals are over the scored tokens,
    which leaves the seed-to-seed spread out, so the seeds are printed beside them and every
    verdict needs the seeds to agree as well."""
    mean, seeds = frame[frame.seed == "mean"], frame[frame.seed != "mean"]
    lines = sorted(mean.line.unique())
    first = ["| training tokens | steps | " + " | ".join(f"{n}: ppl(1x)" for n in lines)
             + " | spread at 1x (each seed's) | within 5%? |", "|---|---|" + "---|" * (len(lines) + 2)]
    second = ["| training tokens | steps | " + " | ".join(f"{n}: ppl(16x)/ppl(1x) (each seed's)" for n in lines)
              + " | 16x ratio, lowest first |", "|---|---|" + "---|" * (len(lines) + 1)]
    for steps, g1 in at_multiple(mean, 1).groupby("steps"):
        head = f"| {tokens_text(g1.train_tokens.iloc[0])} | {steps} | "
        g1 = g1.set_index("line")
        budget_mean, budget_seeds = mean[mean.steps == steps], seeds[seeds.steps == steps]
        s1, s16 = at_multiple(budget_seeds, 1), at_multiple(budget_seeds, 16)
        g16 = at_multiple(budget_mean, 16).set_index("line")
        ppl = [_interval(*g1.loc[n, ["ppl", "ppl_ci_low", "ppl_ci_high"]], 2) if n in g1.index else "" for n in lines]
        worst = g1.loc[g1.vs_best.idxmax()]
        per_seed = s1.groupby("seed").vs_best.max().sort_index()
        spread = _interval(worst.vs_best, worst.vs_best_ci_low, worst.vs_best_ci_high, 3) \
            + f" ({' / '.join(f'{v:.3f}' for v in per_seed)})"
        first.append(head + " | ".join(ppl) + f" | {spread} | {parity(worst, per_seed)} |")
        ratio = [_interval(*g16.loc[n, ["ratio", "ratio_ci_low", "ratio_ci_high"]], 3)
                 + f" ({' / '.join(f'{v:.3f}' for v in s16[s16.line == n].sort_values('seed').ratio)})"
                 if n in g16.index else "" for n in lines]
        second.append(head + " | ".join(ratio) + f" | {ordering(g16, s16)} |")
    return "\n".join(first + [""] + second)


def parity(worst: pd.Series, per_seed: pd.Series) -> str:
    """Whether the lines' ppl at train_len are within 5% of each other: 'yes' where the whole
    interval of the spread (the worst line's ppl over the best's, paired) is at most 1.05 and so is
    every seed's own spread, 'no' where the interval and every seed's spread lie above 1.05, else
    'not distinguishable'."""
    if worst.vs_best_ci_high <= PARITY and (per_seed <= PARITY).all():
        return "yes"
    if worst.vs_best_ci_low > PARITY and (per_seed > PARITY).all():
        return "no"
    return "not distinguishable"


def tokens_text(n: int) -> str:
    """'20.00M' from a million on, else the count ('1,280')."""
    return f"{n / 1e6:.2f}M" if n >= 1_000_000 else f"{int(n):,}"


def ordering(at16: pd.DataFrame, seeds: pd.DataFrame) -> str:
    """'alibi < nope ~ t5 < rope': lines by their 16x ratio, '<' where the neighbours' 95% intervals
    are apart and every seed of the lower line is below every seed of the higher, '~' otherwise (or
    where one has no interval)."""
    g = at16.dropna(subset=["ratio"]).sort_values("ratio")
    text = ""
    for i, (name, r) in enumerate(g.iterrows()):
        if i:
            prev_name, prev = g.index[i - 1], g.iloc[i - 1]
            apart = prev.ratio_ci_high == prev.ratio_ci_high and r.ratio_ci_low == r.ratio_ci_low \
                and prev.ratio_ci_high < r.ratio_ci_low \
                and seeds[seeds.line == prev_name].ratio.max() < seeds[seeds.line == name].ratio.min()
            text += " < " if apart else " ~ "
        text += str(name)
    return text


def figure(frame: pd.DataFrame):
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mean, seeds = frame[frame.seed == "mean"], frame[frame.seed != "mean"]
    panels = [(1, "ppl", "perplexity at train_len"), (16, "ratio", "ppl(16x) / ppl(1x)")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), layout="constrained")
    for ax, (multiple, col, title) in zip(axes, panels):
        each_seed = at_multiple(seeds, multiple)
        for i, (line, g) in enumerate(at_multiple(mean, multiple).groupby("line")):
            g = g.sort_values("train_tokens")
            low, high = g[f"{col}_ci_low"], g[f"{col}_ci_high"]
            ax.errorbar(g.train_tokens, g[col], yerr=[(g[col] - low).fillna(0).clip(lower=0),
                                                      (high - g[col]).fillna(0).clip(lower=0)],
                        marker="o", capsize=3, label=line, color=f"C{i}", gid=f"line:{line}")
            each = each_seed[each_seed.line == line]
            ax.scatter(each.train_tokens, each[col], marker="_", s=60, color=f"C{i}", alpha=0.6,
                       gid=f"seeds:{line}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
            axis(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("training tokens")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize="small")
    axes[1].axhline(1, color="gray", linestyle="--", linewidth=1)
    return fig


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="budget_table.py", description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", help="the study's sweep dirs (outputs/budget_study)")
    parser.add_argument("--out", required=True, help="where budget.csv, budget.md and budget.png go")
    ns = parser.parse_args(argv)
    frame = budget_frame(ns.dirs)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "budget.csv", frame.to_csv(index=False))
    table = summary_markdown(frame)
    atomic_write_text(out / "budget.md", table + "\n\n" + NOTE + "\n\n![budget](budget.png)\n")
    save(figure(frame), out / "budget.png", also_svg=True)
    print(table)


if __name__ == "__main__":
    main(sys.argv[1:])
