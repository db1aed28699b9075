"""Results rows -> the tidy summary: one row per line and length, its geometric mean over
seeds and its 95% intervals of the cell, the ratio to train_len and the comparison with the
column's best (:mod:`posbench.intervals`; docs/report.md)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..eval.results import LINE, METHOD, backfill, by_columns, sort_rows, with_labels
from ..eval.token_nll import row_key
from ..intervals import Cell, Estimator, pool_seeds
from .baselines import run_blocks
from .collect import GROUP
from .longppl import SAME_RTOL
from .verdicts import UNTRAINED, per_value

# summarize(cells=True) only: Cell objects, SeedPools, and whether a line's runs were trained (steps > 0; a
# pretrained model's rows have 0), which the verdicts read to say where a trained line has one seed
CELL_COLUMNS = ("cell", "cell_pool", "ratio_pool", "trained")


COMPARED = ["train_len", "eval_len", "data", "split"]  # the lines one bold / vs_best comparison ranks


def summarize(df: pd.DataFrame, estimator: Estimator | None = None, cells: bool = False,
              per: list[str] = ()) -> pd.DataFrame:
    """Geometric mean (``ppl_mean``: exp of the mean log ppl, the centre of its interval), std, min,
    max of ppl over seeds (and the mean nll, bpb, word_ppl), one row per
    (encoding, rope_scaling, mode, stride, ..., eval_len), with the line's ``label``, its
    parameter counts ``params`` and ``pos_params`` (NaN where the rows predate them) and the
    interval columns of :func:`add_intervals` (bootstrap intervals where rows carry their ``run``
    dir and it holds token_nll.npz); ``cells``: keep each row's :class:`Cell` in a ``cell`` column
    and its column's pooled seed variances in ``cell_pool`` and ``ratio_pool`` (:func:`add_intervals`;
    what :mod:`posbench.report.verdicts` compares); ``per``: ``--per`` keys, whose values split the
    columns that compare lines (:func:`add_intervals`)."""
    df = with_labels(backfill(df))
    ok = df.assign(**{c: df[c].where(df.status == "ok") for c in ("ppl", "nll", "bpb", "word_ppl")})
    stats = ok.assign(log_ppl=np.log(ok.ppl)).groupby(GROUP, dropna=False).agg(
        gmean=("log_ppl", "mean"), std=("ppl", "std"), min=("ppl", "min"), max=("ppl", "max"), count=("ppl", "count"))
    stats["gmean"] = np.exp(stats.gmean)
    stats.columns = ["ppl_mean", "ppl_std", "ppl_min", "ppl_max", "n_ok"]
    means = ok.groupby(GROUP, dropna=False)[["nll", "bpb", "word_ppl"]].mean().add_suffix("_mean")
    seeds = df.groupby(GROUP, dropna=False).seed.nunique().rename("seeds")
    counts = df.groupby(GROUP, dropna=False)[["params", "pos_params"]].max()  # one config per line: one count
    steps = pd.to_numeric(df["steps"], errors="coerce") if "steps" in df else pd.Series(0.0, index=df.index)
    trained = df.assign(trained=steps.fillna(0).gt(0)).groupby(GROUP, dropna=False).trained.any()
    # what ran at inference (one per rope_scaling key), --by values, a mixed text's corpus
    kept = [*METHOD, *by_columns(df), *(["data_name"] if "data_name" in df else [])]
    carried = [df.groupby(GROUP, dropna=False)[kept].first()] if kept else []
    out = with_labels(pd.concat([stats, seeds, means, counts, trained, *carried], axis=1).reset_index())
    out = add_intervals(out.assign(cell=_cells(df)), estimator or Estimator(), per)
    out = out if cells else out.drop(columns=list(CELL_COLUMNS))
    return sort_rows(out[["label"] + [c for c in out if c != "label"]], GROUP)


def per_values(summary: pd.DataFrame, per: list[str]) -> list[tuple[str, ...]]:
    """Each row's value of each ``--per`` key (its ``by:`` column: ``by:train.steps``; 'unset' where
    the row's run lacks the key)."""
    values = [per_value(summary, key).fillna("unset") for key in per]
    return list(zip(*values)) if values else [() for _ in range(len(summary))]


def compared_keys(summary: pd.DataFrame, per: list[str] = ()) -> list[tuple[str, ...]]:
    """Each row's column: the lines it is ranked and pooled with (:func:`add_intervals`)."""
    base = [tuple(r) for r in summary[COMPARED].astype(str).itertuples(index=False)]
    return [b + v for b, v in zip(base, per_values(summary, per))] if per else base


def _cells(df: pd.DataFrame) -> list[Cell]:
    """One :class:`Cell` per GROUP key, in groupby order: the ok seeds' mean NLLs and, where every
    one of them has its block sums (from its run's token_nll.npz, or a shipped run's blocks.npz:
    :func:`posbench.report.baselines.run_blocks`), those."""
    stored: dict[str, dict] = {}

    def blocks(row) -> tuple[np.ndarray, np.ndarray] | None:
        run = row.get("run")
        if not isinstance(run, str):
            return None
        if run not in stored:
            stored[run] = run_blocks(Path(run))
        found = stored[run].get(row_key(row))
        return found if found is not None and int(found[1].sum()) == row["tokens"] else None

    cells = []
    for _, g in df.groupby(GROUP, dropna=False):
        g = g[(g.status == "ok") & g.nll.notna()].sort_values("seed")
        cell = Cell(g.seed.to_numpy(), g.nll.to_numpy(dtype=float))
        sums = [blocks(row) for row in g.to_dict("records")]
        if sums and all(s is not None for s in sums):
            cell.blocks, cell.sizes = np.stack([b for b, _ in sums]), sums[0][1]
            cell.tokens_id = (str(g.data.iloc[0]), str(g.split.iloc[0]), int(g.tokens.iloc[0]))
        cells.append(cell)
    return cells


def add_intervals(summary: pd.DataFrame, estimator: Estimator, per: list[str] = ()) -> pd.DataFrame:
    """Interval columns from the summary's ``cell`` column (see docs/report.md):

    - ``ppl_ci_low``, ``ppl_ci_high``, ``ci_method``: exp of the 95% interval of the mean NLL;
      ``block_tokens``: the length of the cell's bootstrap blocks (NA: no per-token NLL);
    - ``ratio_mean`` (the geometric mean over seeds of each seed's ppl(L) / ppl(train_len), the
      centre of its interval), ``ratio_std`` (their std),
      ``ratio_ci_low``, ``ratio_ci_high``, ``ratio_method``: the line's ratio to its train_len cell,
      paired (by seed, or by resampled blocks);
    - ``vs_best``, ``vs_best_ci_low``, ``vs_best_ci_high``: exp(mean NLL - the lowest mean NLL among
      the lines of the same train_len and eval_len) and its interval; ``tied_best``: True where that
      interval contains 1 (and for the lowest itself, and a line whose mean NLL is the lowest's to
      :data:`~posbench.report.longppl.SAME_RTOL`: the same computation made again at another commit,
      whose paired interval is as narrow as their last bits' difference), False where it lies
      above 1, NA without one.

    A line of fewer than 3 seeds takes at least the seeds' variance pooled over its column's lines
    (:func:`posbench.intervals.seed_term`): of their mean NLLs for its cells, of their per-seed
    log ratios for its ratios; those pools are the ``cell_pool`` and ``ratio_pool`` columns.

    A column is the lines of one train_len, eval_len, text and split, and, with ``per`` (``--per``
    keys), of one value of each: a budget study's lines are ranked and pooled within their budget,
    not against another budget's."""
    column = compared_keys(summary, per)
    cell_pool = {key: pool_seeds(c.nll for c, k in zip(summary.cell, column) if k == key) for key in set(column)}
    cell_ci = [estimator.cell(c, cell_pool[k]) for c, k in zip(summary.cell, column)]
    out = summary.assign(ppl_ci_low=[math.exp(i.low) for i in cell_ci],
                         ppl_ci_high=[math.exp(i.high) for i in cell_ci], ci_method=[i.method for i in cell_ci],
                         block_tokens=pd.array([None if c.sizes is None else int(c.sizes.max()) for c in summary.cell],
                                               dtype="Int64"))
    ratio = {c: [math.nan] * len(out) for c in ("ratio_mean", "ratio_std", "ratio_ci_low", "ratio_ci_high",
                                                 "vs_best", "vs_best_ci_low", "vs_best_ci_high")}
    ratio["ratio_method"] = ["none"] * len(out)
    tied = [pd.NA] * len(out)
    at = {i: pos for pos, i in enumerate(out.index)}
    paired = {}  # row -> (its cell, its line's train_len cell, per-seed log ratios)
    for _, g in out.groupby(LINE, dropna=False):
        base = g[g.eval_len == g.train_len].cell
        if base.empty or not base.iloc[0].nll.size:
            continue
        base = base.iloc[0]
        for i, cell in g.cell.items():
            _, ia, ib = np.intersect1d(cell.seeds, base.seeds, return_indices=True)
            paired[at[i]] = (cell, base, cell.nll[ia] - base.nll[ib])
    ratio_pool = {key: pool_seeds(d for row, (_, _, d) in paired.items() if column[row] == key) for key in set(column)}
    for row, (cell, base, log_ratios) in paired.items():
        per_seed = np.exp(log_ratios)
        d = estimator.difference(cell, base, same_models=True, pools=(ratio_pool[column[row]], None))
        ratio["ratio_mean"][row] = math.exp(d.estimate) if per_seed.size else math.nan  # the geometric mean
        ratio["ratio_std"][row] = float(per_seed.std(ddof=1)) if per_seed.size > 1 else math.nan
        ratio["ratio_ci_low"][row], ratio["ratio_ci_high"][row] = math.exp(d.low), math.exp(d.high)
        ratio["ratio_method"][row] = d.method
    for _, g in out.groupby(pd.Series(column, index=out.index).map(str), sort=False):  # one column's lines
        means = g.cell.map(lambda c: c.mean).dropna()
        if means.empty:
            continue
        best = g.cell[means.idxmin()]
        for i, cell in g.cell.items():
            if not cell.nll.size:
                continue
            row = at[i]
            pool = cell_pool[column[row]]
            d = estimator.difference(cell, best, pools=(pool, pool)) if i != means.idxmin() else None
            low, high = (0.0, 0.0) if d is None else (d.low, d.high)
            ratio["vs_best"][row] = math.exp(cell.mean - best.mean)
            ratio["vs_best_ci_low"][row], ratio["vs_best_ci_high"][row] = math.exp(low), math.exp(high)
            same = math.isclose(cell.mean, best.mean, rel_tol=SAME_RTOL)
            tied[row] = True if same else pd.NA if math.isnan(low) else bool(low <= 0)
    return out.assign(**ratio, tied_best=pd.array(tied, dtype="boolean"), cell_pool=[cell_pool[k] for k in column],
                      ratio_pool=[ratio_pool[k] for k in column])


def untrained_lines(df: pd.DataFrame) -> dict[tuple, tuple[float, float]]:
    """The lines (by :data:`LINE`) of results rows ``df`` whose ppl at train_len (geometric mean over
    seeds) is at least :data:`UNTRAINED` x their unigram perplexity -> (that ppl, the unigram's).
    Rows without ``unigram_ppl`` (written before it) decide nothing."""
    rows = with_labels(backfill(df))
    at = rows[(rows.eval_len == rows.train_len) & (rows.status == "ok") & rows.unigram_ppl.notna() & rows.ppl.notna()]
    found = {}
    for key, g in at.groupby(LINE, dropna=False, sort=False):
        ppl, unigram = float(np.exp(np.log(g.ppl).mean())), float(g.unigram_ppl.mean())
        if ppl >= UNTRAINED * unigram:
            found[key] = (ppl, unigram)
    return found
