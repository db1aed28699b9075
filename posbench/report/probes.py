"""Probe rows -> a score by length with its 95% interval, and each line's effective length.

A probe (passkey, niah_multikey, niah_multivalue, variable_tracking, ...) scores prompts of
several lengths (and depths). The report pools a line's depths and seeds at each length:

* the score is correct / trials over every prompt of that length (the mean of ``metric`` where
  the rows count no trials);
* its 95% interval is Wilson's over those prompts, widened, where the line has two seeds or
  more, to cover the t interval of the seeds' own scores as well: the interval covers both the
  prompts drawn and the model trained (:mod:`posbench.intervals`).

The **effective length** follows RULER (Hsieh et al. 2024, sec. 4): the longest length up to
which the score stays at or above a threshold at every probed length, here
:data:`THRESHOLD` unless ``posbench report --threshold`` says otherwise (RULER's 85.6% is
Llama-2-7B's score at 4k, a bar for large models; posbench's small models rarely reach it). Its
interval applies the same rule to the interval's bounds: the low end counts a length only where
the whole interval is at or above the threshold, the high end wherever the interval reaches it;
a point estimate therefore always lies inside its interval.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..eval.results import line_names, with_labels
from ..intervals import t_interval, wilson_interval

THRESHOLD = 0.5
COLUMNS = ["label", "length", "train_len", "seeds", "correct", "trials", "score", "ci_low", "ci_high"]


def probe_summary(rows: pd.DataFrame, metric: str = "accuracy") -> pd.DataFrame:
    """A probe's rows (every run, depth and seed) -> one row per line and length: the pooled
    score and its 95% interval (module docstring); lengths that could not run are left out."""
    rows = rows if "label" in rows else with_labels(rows)
    rows = rows.assign(label=line_names(rows))
    if "status" in rows:
        rows = rows[rows.status.fillna("ok") == "ok"]
    counted = {"correct", "trials"} <= set(rows)
    out = []
    for (label, length), g in rows.groupby(["label", "length"], sort=False):
        seeds = g.groupby("seed")
        if counted:
            correct, trials = float(g.correct.sum()), float(g.trials.sum())
            ci = wilson_interval(correct, trials)
            score, low, high = correct / trials, ci.low, ci.high
            per_seed = (seeds.correct.sum() / seeds.trials.sum()).to_numpy(dtype=float)
        else:
            correct = trials = math.nan
            score, low, high = float(g[metric].mean()), math.nan, math.nan
            per_seed = seeds[metric].mean().to_numpy(dtype=float)
        if len(per_seed) > 1:
            spread = t_interval(per_seed)
            low, high = np.nanmin([low, spread.low]), np.nanmax([high, spread.high])
        out.append({"label": label, "length": int(length), "train_len": int(g.train_len.max()),
                    "seeds": len(per_seed), "correct": correct, "trials": trials, "score": score,
                    "ci_low": max(0.0, float(low)), "ci_high": min(1.0, float(high))})
    return pd.DataFrame(out, columns=COLUMNS).sort_values(["label", "length"], kind="stable").reset_index(drop=True)


def longest_holding(lengths, holds) -> int | None:
    """The longest of ``lengths`` (ascending) up to which every ``holds`` is true; None when the
    first does not."""
    found = None
    for length, ok in zip(lengths, holds):
        if not ok:
            break
        found = int(length)
    return found


def effective_lengths(summary: pd.DataFrame, threshold: float = THRESHOLD) -> pd.DataFrame:
    """label -> effective length, its interval's ends (None: below the threshold already at the
    shortest length probed), the shortest length and train_len."""
    out = []
    for label, g in summary.groupby("label", sort=False):
        g = g.sort_values("length")
        ok = g.score.notna()
        out.append({"label": label, "shortest": int(g.length.iloc[0]), "train_len": int(g.train_len.max()),
                    "effective": longest_holding(g.length, ok & (g.score >= threshold)),
                    "low": longest_holding(g.length, ok & (g.ci_low >= threshold)),
                    "high": longest_holding(g.length, ok & (g.ci_high.fillna(g.score) >= threshold))})
    return pd.DataFrame(out)


def _length_text(length, shortest: int) -> str:
    return f"< {shortest}" if length is None or pd.isna(length) else str(int(length))


def effective_length_lines(summary: pd.DataFrame, name: str, threshold: float = THRESHOLD) -> list[str]:
    """One sentence per line: its effective length with the interval."""
    lines = []
    for r in effective_lengths(summary, threshold).itertuples():
        eff, low, high = (_length_text(x, r.shortest) for x in (r.effective, r.low, r.high))
        ratio = f" ({r.effective / r.train_len:g}x train_len)" if r.effective is not None \
            and not pd.isna(r.effective) else ""
        lines.append(f"{name}, {r.label}: effective length {eff}{ratio}, 95% interval {low} .. {high} "
                     f"(score >= {threshold:g} at every length probed up to it)")
    return lines


def probe_markdown(summary: pd.DataFrame) -> str:
    """Score by length (columns) per line: ``0.75 [0.41, 0.93]`` with the prompts counted."""
    lengths = sorted(summary.length.unique())
    lines = ["| line | " + " | ".join(str(n) for n in lengths) + " |", "|" + "---|" * (1 + len(lengths))]
    for label, g in summary.groupby("label", sort=False):
        cells = []
        for n in lengths:
            r = g[g.length == n]
            if r.empty:
                cells.append("")
                continue
            r = r.iloc[0]
            ci = "" if math.isnan(r.ci_low) else f" [{r.ci_low:.2f}, {r.ci_high:.2f}]"
            count = "" if math.isnan(r.trials) else f" ({int(r.correct)}/{int(r.trials)})"
            cells.append(f"{r.score:.2f}{ci}{count}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
