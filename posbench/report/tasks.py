"""Algorithmic length-generalization tasks: many run dirs' tasks.csv -> one tidy table, Markdown, figure.

    posbench report outputs/tasks_sweep          # tasks_report.md/.csv, tasks.png/.svg in that dir

A task run (copy, reverse, addition, sort, parity, associative recall, duplicate; Kazemnejad et
al. 2023, Ruoss et al. 2023) writes tasks.csv (:data:`posbench.eval.results.TASK_COLUMNS`): per
evaluated instance size, the fraction of instances answered exactly (``exact_match``) and the
mean, over instances, of the fraction of answer tokens right (``token_acc``, with its sd).

Each table row and figure line is one *label*: the encoding, ``<encoding> +rand`` when it was
trained with randomized positions drawn from [0, L) (Ruoss et al. 2023), and ``+rand L=<L>``
when one encoding appears with several L. A cell is one (task, label, train_size, eval_size).

Seeds are pooled, nothing else: a cell whose rows carry different ``config_hash`` values, or
repeat a seed, stops the report. Each cell's interval (docs/tasks_report.md):

- **seeds** (``basis``), with at least :data:`posbench.intervals.MIN_SEEDS` seeds: the mean over
  seeds of each seed's score, and the t interval over those seed means, widened where needed to
  cover the pooled-instance interval below (seeds that all score 0% would otherwise give an
  interval of width 0);
- **instances**, with 1 or 2 seeds: the pooled score over all the cell's instances; for exact
  match the Wilson interval of the pooled successes, for token accuracy the t interval over the
  union of the instances, whose mean and sd are combined exactly from each run's mean, sd and
  count (:func:`posbench.intervals.pooled_moments`).

Intervals are clipped to [0, 1]. The verdict per task compares exact match at the largest
evaluated multiple: a line is named below the highest only where their intervals do not
overlap; otherwise the lines are "not distinguishable". Nothing is ranked on overlapping
intervals.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from ..errors import PosbenchError
from ..eval.results import TASK_COLUMNS, TASKS, find_files, read_table, report_dir
from ..intervals import MIN_SEEDS, Interval, pooled_t_interval, t_interval, wilson_interval
from ..runs.rundir import atomic_write_text
from .figures import save, tasks_figure

GROUP = ["task", "label", "train_size", "eval_size", "multiple"]  # one cell
SUMMARY_COLUMNS = GROUP + ["encoding", "random_positions", "basis", "seeds", "instances",
                           "exact_match", "exact_std", "exact_lo", "exact_hi", "exact_method",
                           "token_acc", "token_std", "token_lo", "token_hi", "token_method", "params"]
NOTE = ("% of instances [95% interval]. n is the instance size evaluated, 2x twice the largest "
        "size seen in training. A cell with >= 3 seeds gives the mean over seeds and a t interval over the "
        "seed means (widened to cover the pooled-instance interval where that is wider); with 1 or 2 "
        "seeds, the score pooled over all the cell's instances, with a Wilson "
        "interval for exact match (the whole answer right) and, for token accuracy (the fraction of "
        "answer tokens right, averaged over instances), a t interval over the instances, pooled exactly "
        "from each run's mean, sd and count. Intervals are clipped to [0, 100]%. The verdict compares exact "
        "match at the largest multiple and names a line below the highest only where their 95% intervals "
        "do not overlap.")


class TaskReport(NamedTuple):
    summary: pd.DataFrame  # the tidy table (tasks_report.csv)
    table: str  # the Markdown tables, one section per task
    text: list[str]  # the verdicts, one per task
    files: list[Path]  # everything written


# ---------------------------------------------------------------- reading
def read_tasks(paths: list[str | Path]) -> pd.DataFrame:
    """Every tasks.csv under ``paths`` (run dirs, sweep dirs or tasks.csv files), concatenated,
    with each row's ``run`` dir; empty (with the columns) where there is none."""
    frames = []
    for f in find_files(paths, TASKS):
        df = read_table(f)
        missing = [c for c in TASK_COLUMNS if c not in df]
        if missing:
            raise PosbenchError(f"report: {str(f)!r} lacks column(s) {', '.join(missing)}; valid: a tasks.csv "
                                f"with columns {', '.join(TASK_COLUMNS)}")
        frames.append(df.assign(run=str(f.parent)))
    if not frames:
        return pd.DataFrame(columns=TASK_COLUMNS + ["run"])
    return pd.concat(frames, ignore_index=True)


def task_labels(df: pd.DataFrame) -> pd.Series:
    """Each row's line: 'rope', 'rope +rand' for randomized positions, 'rope +rand L=2048' where
    the rows hold rope with more than one L."""
    rand = df.random_positions > 0
    spans = df[rand].groupby("encoding").random_positions.nunique()
    several = set(spans[spans > 1].index)
    labels = [enc if not length > 0 else f"{enc} +rand L={int(length)}" if enc in several else f"{enc} +rand"
              for enc, length in zip(df.encoding, df.random_positions)]
    return pd.Series(labels, index=df.index, dtype=object)


# ---------------------------------------------------------------- summary
def check_cells(df: pd.DataFrame) -> None:
    """Refuse to pool a cell over runs that differ in more than the seed, or over one seed twice."""
    for keys, g in df.groupby(GROUP):
        where = f"{keys[0]} {keys[1]} at eval_size={keys[3]}"
        if g.config_hash.nunique() > 1:
            first = g.drop_duplicates("config_hash")
            runs = "; ".join(f"{h} in {r}" for h, r in zip(first.config_hash, first.run))
            raise PosbenchError(f"report: cannot pool {where} over runs whose configs differ (config_hash {runs}); "
                                "pass fewer dirs, so that each line's runs differ only in seed")
        twice = g[g.seed.duplicated(keep=False)]
        if len(twice):
            raise PosbenchError(f"report: {where} has {len(twice)} rows for seed(s) "
                                f"{', '.join(map(str, sorted(set(twice.seed))))} "
                                f"(in {', '.join(sorted(set(twice.run)))}); "
                                "pass each run once, with one row per eval_size")


def _clip(x: float) -> float:
    return x if math.isnan(x) else min(1.0, max(0.0, x))


def cell_summary(g: pd.DataFrame) -> dict:
    """One cell's rows (one per seed) -> basis, seeds, instances and, for exact match and token
    accuracy: estimate, std over seeds (NaN for one seed), 95% interval clipped to [0, 1], method."""
    seeds, instances = int(g.seed.nunique()), int(g.instances.sum())
    successes = float(np.round(g.exact_match * g.instances).sum())  # exact_match counts whole instances
    pooled_exact = wilson_interval(successes, instances)
    pooled_token = pooled_t_interval(g.token_acc, g.token_sd, g.instances)
    if seeds >= MIN_SEEDS:  # never narrower than the pooled instances allow (seeds that agree exactly)
        basis = "seeds"
        exact = _widened(t_interval(g.exact_match), pooled_exact)
        token = _widened(t_interval(g.token_acc), pooled_token)
    else:
        basis, exact, token = "instances", pooled_exact, pooled_token
    out = {"basis": basis, "seeds": seeds, "instances": instances}
    for name, iv, col in (("exact", exact, "exact_match"), ("token", token, "token_acc")):
        out.update({col: iv.estimate, f"{name}_std": float(g[col].std(ddof=1)) if seeds > 1 else math.nan,
                    f"{name}_lo": _clip(iv.low), f"{name}_hi": _clip(iv.high), f"{name}_method": iv.method})
    out["params"] = g.params.max()
    return out


def _widened(seeds: Interval, pooled: Interval) -> Interval:
    """The interval over seeds, widened to cover the pooled-instance one: seeds that all score
    0% (or 100%) give a t interval of width 0, which would claim more than 3 x 256 instances know."""
    if any(math.isnan(v) for v in (pooled.low, pooled.high)):
        return seeds
    return Interval(seeds.estimate, min(seeds.low, pooled.low), max(seeds.high, pooled.high), seeds.method)


def summarize_tasks(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, label, train_size, eval_size) with :data:`SUMMARY_COLUMNS`, sorted by
    task, label and eval size."""
    df = df.assign(label=task_labels(df))
    check_cells(df)
    rows = [{**dict(zip(GROUP, keys)), "encoding": g.encoding.iloc[0],
             "random_positions": int(g.random_positions.iloc[0]), **cell_summary(g)}
            for keys, g in df.groupby(GROUP, sort=True)]
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


# ---------------------------------------------------------------- Markdown and verdicts
def percent_text(value: float, low: float, high: float) -> str:
    """'95.0% [90.1, 97.6]'; 'n/a' without a value, '[no interval]' without an interval."""
    if value is None or math.isnan(value):
        return "n/a"
    interval = "[no interval]" if math.isnan(low) or math.isnan(high) else f"[{100 * low:.1f}, {100 * high:.1f}]"
    return f"{100 * value:.1f}% {interval}"


def _span(values: pd.Series) -> str:
    lo, hi = int(values.min()), int(values.max())
    return str(lo) if lo == hi else f"{lo}-{hi}"


SCORES = {"exact": "exact_match", "token": "token_acc"}  # column prefix -> score column


def _table(g: pd.DataFrame, prefix: str) -> list[str]:
    """One task's lines as rows, eval sizes as columns ('2x (n=40)'), cells 'score% [lo, hi]'."""
    columns = sorted(set(zip(g.multiple, g.eval_size)))
    head = ["line", "seeds", "instances", *(f"{m:g}x (n={n})" for m, n in columns)]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, h in g.groupby("label", sort=False):
        cells = {(m, n): percent_text(v, lo, hi) for m, n, v, lo, hi in
                 zip(h.multiple, h.eval_size, h[SCORES[prefix]], h[f"{prefix}_lo"], h[f"{prefix}_hi"])}
        out.append("| " + " | ".join([label, _span(h.seeds), _span(h.instances),
                                      *(cells.get(c, "") for c in columns)]) + " |")
    return out


def task_verdict(task: str, g: pd.DataFrame) -> str:
    """Which lines' exact match at the task's largest multiple lies below the highest line's
    with non-overlapping 95% intervals; 'not distinguishable' where none does."""
    top = g.multiple.max()
    at = g[g.multiple == top].dropna(subset=["exact_match"])
    where = f"{task} at {top:g}x (n={', '.join(map(str, sorted(at.eval_size.unique())))})"
    if at.empty:
        return f"{task}: no exact match at {top:g}x"
    best = at.loc[at.exact_match.idxmax()]
    best_text = f"{best.label} {percent_text(best.exact_match, best.exact_lo, best.exact_hi)}"
    if len(at) == 1:
        return f"{where}: one line, {best_text}: nothing to compare"
    apart = at[at.exact_hi < best.exact_lo]  # NaN (no interval) compares False: never apart
    if apart.empty:
        return (f"{where}: not distinguishable: every line's 95% interval of exact match overlaps that "
                f"of the highest, {best_text}")
    shown = ", ".join(f"{r.label} {percent_text(r.exact_match, r.exact_lo, r.exact_hi)}" for r in apart.itertuples())
    text = f"{where}: {shown} below {best_text} (95% intervals do not overlap)"
    tied = at[(at.index != best.name) & ~at.index.isin(apart.index)]
    return text + (f"; {', '.join(tied.label)} not distinguishable from it" if len(tied) else "")


def task_verdicts(summary: pd.DataFrame) -> list[str]:
    """One :func:`task_verdict` per task."""
    return [task_verdict(task, g) for task, g in summary.groupby("task", sort=False)]


def tasks_markdown(summary: pd.DataFrame) -> str:
    """Per task: a heading, the exact-match table, the token-accuracy table and the verdict."""
    out = [f"Cells: {NOTE}"]
    for task, g in summary.groupby("task", sort=False):
        out += ["", f"## {task}", "", "Exact match (% of instances whose whole answer is right):", "",
                *_table(g, "exact"), "",
                "Token accuracy (% of answer tokens right, mean over instances):", "", *_table(g, "token"),
                "", f"Verdict: {task_verdict(task, g)}."]
    return "\n".join(out)


# ---------------------------------------------------------------- files
def task_setup(tasks: pd.DataFrame) -> pd.DataFrame:
    """One row per run of tasks.csv rows, for the figure's caption: ``model`` (model.name of the
    run's config.yaml, where it has one), ``params`` and ``steps`` (the step it was evaluated at)."""
    from omegaconf import OmegaConf

    if "run" not in tasks or tasks.empty:
        return pd.DataFrame(columns=["run", "model", "params", "steps"])
    runs = tasks.groupby("run", sort=False).agg(params=("params", "first"), steps=("step", "max")).reset_index()
    models = []
    for run in runs.run:
        config = Path(run) / "config.yaml"
        models.append(OmegaConf.select(OmegaConf.load(config), "model.name") if config.is_file() else None)
    return runs.assign(model=models)


def write_task_report(tasks: pd.DataFrame, out: str | Path, footer: str = "") -> TaskReport:
    """tasks_report.csv (the summary), tasks_report.md (tables, verdicts, ``footer``) and
    tasks.png/.svg (:func:`posbench.report.figures.tasks_figure`) in ``out``, from :func:`read_tasks` rows."""
    out = Path(out)
    summary = summarize_tasks(tasks)
    table = tasks_markdown(summary)
    files = [out / "tasks_report.csv", out / "tasks_report.md"]
    atomic_write_text(files[0], summary.to_csv(index=False))
    atomic_write_text(files[1], f"# Algorithmic tasks\n\n{table}{footer}\n\n## Figure\n\n![tasks](tasks.png)\n")
    files += save(tasks_figure(summary, task_setup(tasks)), out / "tasks.png", also_svg=True)
    return TaskReport(summary, table, task_verdicts(summary), files)


def task_report(paths: list[str | Path], out: str | Path | None = None) -> TaskReport:
    """The task report of every tasks.csv under ``paths``, written to ``out`` (default: the single
    directory given, else ./report)."""
    tasks = read_tasks(paths)
    if tasks.empty:
        raise PosbenchError(f"report: no tasks.csv under {', '.join(map(str, paths))}; pass run or sweep "
                            "directories of algorithmic task runs")
    return write_task_report(tasks, report_dir(paths, out))
