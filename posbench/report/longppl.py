"""LongPPL in the report: where ``posbench longppl`` wrote a longppl.csv under the reported paths
(:mod:`posbench.eval.longppl`; a study keeps it beside its runs), report.md gets a LongPPL section
and the report folder longppl.csv (the summary) and longppl.png/.svg.

Per line (as results rows name it: encoding, scaling, protocol, and the model where several are
reported) and length: LongPPL and the perplexity over the same tokens, each the geometric mean over
the seeds, with the key and scored token counts and the evaluator that chose the key tokens. Then
the pairs of lines whose order at a length differs between LongPPL and perplexity: what Fang et al.
(ICLR 2025) show perplexity misses.

Intervals: rows that carry their per-block sums (``posbench longppl`` writes them; see
:func:`posbench.eval.longppl.block_columns`) get the perplexity report's estimator
(:mod:`posbench.intervals`, seeds and text): LongPPL is a perplexity over a subset of the
tokens, so a cell is each seed's mean key-token NLL with its per-block key-token sums, and the
blocks are the perplexity bootstrap's contiguous blocks of the scored text, merged forward where
one holds no key token (:func:`key_blocks`: a resample must draw some key token; fewer blocks,
fewer degrees of freedom). A reversal is then said to hold only where both paired ratios, of the
LongPPLs and of the perplexities over the same tokens, have 95% intervals that exclude 1. Rows
without block sums (written before they were kept) stay point estimates, and the section says so.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..eval.longppl import ALPHA, BLOCK_COLUMNS, FILE
from ..eval.results import find_files, line_label, read_table
from ..intervals import Cell, Estimator, block_sums
from ..runs.rundir import atomic_write_text

MIN_GROUPS = 3  # blocks holding key tokens that an interval needs (with two, Student's t has one df)
SUMMARY = "longppl.csv"  # in the report folder: the summary below, not the rows ``posbench longppl`` wrote


def read_longppl(paths: list[str | Path], out: Path) -> pd.DataFrame:
    """Every longppl.csv under ``paths`` (not the report folder's own summary), one frame."""
    own = (Path(out) / SUMMARY).resolve()
    found = [p for p in find_files(paths, FILE) if p.resolve() != own]
    return pd.concat([read_table(p) for p in found], ignore_index=True) if found else pd.DataFrame()


def parsed(cell) -> np.ndarray | None:
    """A block column's cell -> its values (None where the row has none)."""
    if not isinstance(cell, str) or not cell:
        return None
    return np.array([float(v) for v in cell.split(";")])


def key_blocks(counts: np.ndarray) -> np.ndarray:
    """Each block's group: a block holding no key token joins the next that holds one (the last
    empty ones the one before), so every group is contiguous and holds some key token."""
    groups, current = np.zeros(counts.size, np.int64), 0
    for i, c in enumerate(counts):
        groups[i] = current
        if c > 0:
            current += 1
    if counts.size and counts[-1] == 0:  # trailing empty blocks: into the last group that has a key token
        groups[groups == current] = max(current - 1, 0)
    return groups


def _cells(g: pd.DataFrame) -> tuple[Cell | None, Cell | None]:
    """(LongPPL cell, perplexity cell) of one line at one length, from its rows' block sums (one
    row a seed); None where a row has none."""
    if not all(c in g for c in BLOCK_COLUMNS):
        return None, None
    nll, key, counts = ([parsed(v) for v in g[c]] for c in BLOCK_COLUMNS)
    if any(x is None for x in (*nll, *key, *counts)) or len({x.size for x in (*nll, *key, *counts)}) != 1:
        return None, None
    counts0 = counts[0]
    if counts0.sum() <= 0 or any(not np.array_equal(c, counts0) for c in counts):
        return None, None
    groups = key_blocks(counts0)
    if groups.max() + 1 < MIN_GROUPS:  # key tokens in one or two blocks: no spread of the text to measure
        return None, None

    def merge(x: np.ndarray) -> np.ndarray:  # per block -> per group of key_blocks
        return np.bincount(groups, weights=x)

    sizes = block_sums(np.zeros(int(g.tokens.iloc[0])))[1]
    seeds = g.seed.to_numpy()
    tokens_id = (str(g.evaluator.iloc[0]), int(g.tokens.iloc[0]))
    lp = Cell(seeds, np.log(g.longppl.to_numpy(np.float64)), np.stack([merge(k) for k in key]),
              merge(counts0), tokens_id)
    pp = Cell(seeds, np.log(g.ppl.to_numpy(np.float64)), np.stack(nll), sizes.astype(np.float64), tokens_id)
    return lp, pp


def longppl_summary(rows: pd.DataFrame, estimator: Estimator | None = None) -> pd.DataFrame:
    """(line, eval_len) -> LongPPL and ppl over the same tokens (geometric means over seeds), with
    95% intervals where the rows carry block sums (module docstring); ``cells`` holds each
    line's (LongPPL, ppl) cells for :func:`order_changes`. A line is named by its encoding and
    method, with its train_len where the rows have several (a study's judge, trained longer, is
    never pooled with the runs it judges) and its model where they have several."""
    estimator = estimator or Estimator()
    several = rows.model.nunique() > 1
    lengths = "train_len" in rows and rows.train_len.nunique() > 1  # e.g. a judge trained longer beside the runs
    line = [line_label(r.encoding, r.rope_scaling, r["mode"], r.stride)
            + (f" [train_len={r.train_len}]" if lengths else "") + (f" ({r.model})" if several else "")
            for _, r in rows.iterrows()]
    rows = rows.assign(line=line, log_longppl=np.log(rows.longppl), log_ppl=np.log(rows.ppl))
    out = []
    for (name, length), g in rows.groupby(["line", "eval_len"], sort=False):
        lp, pp = _cells(g)
        lo, hi = (estimator.cell(lp)[1:3] if lp is not None else (math.nan, math.nan))
        out.append({"line": name, "eval_len": length, "train_len": g.train_len.iloc[0] if "train_len" in g else None,
                    "longppl": math.exp(g.log_longppl.mean()),
                    "longppl_ci_low": math.exp(lo), "longppl_ci_high": math.exp(hi),
                    "ppl": math.exp(g.log_ppl.mean()), "seeds": g.seed.nunique(),
                    "key_tokens": g.key_tokens.iloc[0], "tokens": g.tokens.iloc[0], "evaluator": g.evaluator.iloc[0],
                    "long_len": g.long_len.iloc[0], "short_len": g.short_len.iloc[0],
                    "short_stride": g.short_stride.iloc[0], "cells": (lp, pp)})
    return pd.DataFrame(out).sort_values(["eval_len", "longppl"], ignore_index=True)


def summary_table(summary: pd.DataFrame) -> pd.DataFrame:
    """:func:`longppl_summary` as its CSV holds it: without the cells, and without train_len, which
    only sets :func:`order_changes`' setups (a line's name carries it where the rows have several)."""
    return summary.drop(columns=["cells", "train_len"])


def order_changes(summary: pd.DataFrame, estimator: Estimator | None = None) -> list[str]:
    """Each length's pairs of lines that LongPPL and perplexity order oppositely. Lines with the
    same two values at a length (a method that leaves the model as trained there reuses its rows)
    are one entry, named ``a = b`` in the order of the names (not of values that differ in their
    last bits, which would reorder a quoted line), so one fact is said once; "the same" is to :data:`SAME_RTOL`,
    since a row computed again at another commit differs from its earlier copies in the last bits
    of its float32 per-token NLLs, and two values that close are no order. Each entry gives how far apart the
    two LongPPLs are in nats summed over the key tokens, k |ln(LongPPL_a / LongPPL_b)| (k key
    tokens): below 1, less than one key token's NLL moving by one nat, which on a few dozen key
    tokens is no finding. Where both lines carry block sums, the entry gives the paired 95%
    intervals of both ratios and says whether the reversal holds (both exclude 1). Only lines of one
    train_len are compared, as the report's verdicts compare one setup's lines: a study's judge,
    trained longer and the one that chose the key tokens, is no rival of the runs it judges."""
    estimator = estimator or Estimator()
    found = []
    summary = summary if "key_tokens" in summary else summary.assign(key_tokens=np.nan)
    summary = summary if "cells" in summary else summary.assign(cells=[(None, None)] * len(summary))
    setup = ["eval_len"] + (["train_len"] if "train_len" in summary and summary.train_len.notna().all() else [])
    for keys, g in summary.groupby(setup, sort=True):
        length = keys[0]
        g = g.sort_values("line", kind="stable")
        g = g.assign(same=_same_values(g)).groupby("same", sort=False, as_index=False).agg(
            line=("line", " = ".join), ppl=("ppl", "first"), longppl=("longppl", "first"),
            key_tokens=("key_tokens", "first"), cells=("cells", _with_blocks))
        for a, b in itertools.combinations(g.itertuples(), 2):
            if _apart(a.ppl, b.ppl) and _apart(a.longppl, b.longppl) and (a.ppl - b.ppl) * (a.longppl - b.longppl) < 0:
                lo, hi = (a, b) if a.ppl < b.ppl else (b, a)
                nats = "" if np.isnan(a.key_tokens) else \
                    f"; {a.key_tokens * abs(np.log(a.longppl / b.longppl)):.1f} nats apart over the key tokens"
                found.append(f"at {length}: {lo.line} < {hi.line} by perplexity ({lo.ppl:.2f} < {hi.ppl:.2f}), "
                             f"{hi.line} < {lo.line} by LongPPL ({hi.longppl:.2f} < {lo.longppl:.2f}{nats})"
                             + _reversal_intervals(hi.cells, lo.cells, estimator))
    return found


SAME_RTOL = 1e-6  # relative: a row computed again agrees with its copies to about 1e-7 (LongPPL), 1e-8 (ppl)


def _apart(x: float, y: float) -> bool:
    return not math.isclose(x, y, rel_tol=SAME_RTOL)


def _same_values(g: pd.DataFrame) -> list[int]:
    """A group number per line of ``g``: lines whose ppl and LongPPL both agree to
    :data:`SAME_RTOL` with the group's first line share it (in the order of ``g``)."""
    firsts: list[tuple[float, float]] = []
    groups = []
    for ppl, lp in zip(g.ppl, g.longppl):
        at = next((i for i, (p, q) in enumerate(firsts) if not _apart(p, ppl) and not _apart(q, lp)), None)
        if at is None:
            firsts.append((ppl, lp))
            at = len(firsts) - 1
        groups.append(at)
    return groups


def _with_blocks(cells: pd.Series):
    """The cells of an entry's lines (one value to 1e-6) to compare it by: the first line's that carry
    block sums, where one does (a row computed again beside copies written before they were kept)."""
    return next((c for c in cells if not any(x is None for x in c)), cells.iloc[0])


def _reversal_intervals(hi, lo, estimator: Estimator) -> str:
    """': LongPPL ratio r [a, b], ppl ratio r' [a', b']; holds: ...' for the line lower by LongPPL
    (``hi``) against the one lower by perplexity (``lo``); '' where either lacks block sums."""
    if any(c is None for c in (*hi, *lo)):
        return ""
    lp, pp = estimator.difference(hi[0], lo[0]), estimator.difference(hi[1], lo[1])
    if any(math.isnan(x) for x in (lp.low, pp.low)):
        return ""
    holds = lp.high < 0 < pp.low
    return (f": LongPPL ratio {math.exp(lp.estimate):.3f} [{math.exp(lp.low):.3f}, {math.exp(lp.high):.3f}], "
            f"ppl ratio {math.exp(pp.estimate):.4f} [{math.exp(pp.low):.4f}, {math.exp(pp.high):.4f}]"
            + ("; holds: both intervals exclude 1" if holds else "; not told apart: an interval holds 1"))


def longppl_markdown(summary: pd.DataFrame, estimator: Estimator | None = None, alpha: float = ALPHA,
                     title: str = "LongPPL") -> str:
    """The LongPPL section: its table, intervals and order changes; ``alpha`` the key tokens' LSD
    threshold the rows were chosen with, ``title`` the section's heading."""
    first = summary.iloc[0]
    with_ci = summary.longppl_ci_low.notna() if "longppl_ci_low" in summary else pd.Series(False, summary.index)

    def value(r) -> str:
        return f"{r.longppl:.2f}" + (f" [{r.longppl_ci_low:.2f}, {r.longppl_ci_high:.2f}]" if with_ci[r.Index] else "")

    rows = "".join(f"| {r.line} | {r.eval_len} | {value(r)} | {r.ppl:.2f} | {r.key_tokens:,} of {r.tokens:,} "
                   f"| {r.seeds} |\n" for r in summary.itertuples())
    changes = order_changes(summary, estimator)
    said = ("".join(f"- {c}\n" for c in changes) if changes else
            "- LongPPL orders the lines at every length as perplexity does.\n")
    if with_ci.all():
        cis = ("LongPPL's 95% interval covers the seeds and the text (the perplexity estimator on the key tokens' "
               "per-block sums; blocks with no key token merged into the next).")
    elif with_ci.any():
        cis = ("Intervals where the rows carry per-block sums (the perplexity estimator on the key tokens); the "
               "rows without them are point estimates.")
    else:
        cis = (f"No interval: these rows keep no per-block sums, or their key tokens lie in fewer than {MIN_GROUPS} "
               "of the text's blocks, so they compare point estimates.")
    return (f"\n## {title}\n\nPerplexity over the key tokens only (Fang et al., ICLR 2025: the tokens the evaluator "
            f"predicts more than {alpha:g} nats better with a long context): evaluator `{first.evaluator}`, long "
            f"context {first.long_len:,}, short {first.short_len:,} (stride {first.short_stride:,}). Geometric means "
            f"over the seeds; `ppl` is over the same scored tokens. {cis}\n\n"
            "| line | eval_len | LongPPL | ppl | key tokens | seeds |\n|---|---|---|---|---|---|\n" + rows
            + "\nWhere LongPPL orders two lines oppositely to perplexity (with k key tokens, one "
            "key token's NLL moving by one nat moves LongPPL by a factor e^(1/k)"
            + (f", {np.exp(1 / first.key_tokens):.3f} for these {first.key_tokens:,}" if first.key_tokens else "")
            + ": a pair less than a nat apart over the key tokens is within that; where both lines carry block sums, "
            "the paired 95% intervals of both ratios, and whether the reversal holds):\n\n" + said)


def longppl_figure(summary: pd.DataFrame):
    """LongPPL (left, its 95% interval a band where the rows carry block sums) and perplexity over
    the same tokens (right) against length, one line each.
    Past ten lines colours come from tab20 and markers vary too, as in the report's other figures
    of many lines, and the legend goes below both panels, where it hides no point."""
    from .figures import _pyplot

    plt = _pyplot()
    lines = list(dict.fromkeys(summary.line))
    many = len(lines) > 10
    colours = plt.get_cmap("tab20").colors if many else plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = "osD^v<>ph*" if many else "o"
    legend_height = 0.2 * ((len(lines) + 2) // 3) + 0.15  # inches: three names a row
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2 + legend_height), sharex=True)
    for i, (line, g) in enumerate(summary.groupby("line", sort=False)):
        g = g.sort_values("eval_len")
        style = {"color": colours[i % len(colours)], "marker": markers[i % len(markers)], "label": line}
        for ax, column in zip(axes, ("longppl", "ppl")):
            ax.plot(g.eval_len, g[column], **style)
            style.pop("label", None)
        if "longppl_ci_low" in g and g.longppl_ci_low.notna().any():  # LongPPL's 95% interval as a band
            axes[0].fill_between(g.eval_len, g.longppl_ci_low, g.longppl_ci_high, color=style["color"], alpha=0.12,
                                 linewidth=0)
    for ax, title in zip(axes, ("LongPPL (key tokens)", "perplexity (same tokens)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_title(title)
    fig.legend(loc="lower center", ncol=3, fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, legend_height / (4.2 + legend_height), 1, 1))
    return fig


def longppl_part(paths: list[str | Path], out: Path) -> tuple[str, list[Path]]:
    """report.md's LongPPL section and the files written (none where no longppl.csv is found)."""
    return longppl_section(read_longppl(paths, out), out)


def longppl_section(rows: pd.DataFrame, out: Path, name: str = "longppl", title: str = "LongPPL"
                    ) -> tuple[str, list[Path]]:
    """The section on ``rows`` (a longppl.csv's) and the files written to ``out``: ``name``.csv
    (the summary) and ``name``.png/.svg; none where ``rows`` is empty."""
    from .figures import save

    if rows.empty:
        return "", []
    if not (rows.key_tokens > 0).any():  # LongPPL is the mean over no tokens: say so, draw nothing
        first = rows.iloc[0]
        return ("\n## {}\n\nNo key tokens: the evaluator `{}` (long context {:,}, short {:,}, stride {:,}) "
                "predicts no scored token more than {} nats better with the long context, with at least {} "
                "log-probability, so LongPPL is not defined for these rows.\n").format(
                    title, first.evaluator, first.long_len, first.short_len, first.short_stride, first.alpha,
                    first.beta), []
    estimator = Estimator()
    summary = longppl_summary(rows[rows.key_tokens > 0], estimator)
    atomic_write_text(out / f"{name}.csv", summary_table(summary).to_csv(index=False))
    files = [out / f"{name}.csv"] + save(longppl_figure(summary), out / f"{name}.png", also_svg=True)
    alpha = float(rows.alpha.iloc[0]) if "alpha" in rows else ALPHA
    return longppl_markdown(summary, estimator, alpha, title), files
