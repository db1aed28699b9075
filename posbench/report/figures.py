"""The report's figures, each a function that takes tidy rows and returns a matplotlib Figure.

- :func:`ppl_figure`: perplexity vs evaluation length, one line per label (mean over seeds,
  its 95% interval shaded), and beside it the paper's published numbers.
- :func:`run_figure`: one run's perplexity vs length (``ppl_vs_length.png`` in a run dir).
- :func:`positions_figure`: mean NLL vs position in the window (positions.csv).
- :func:`probe_figure`: a probe's score by length (x depth for passkey), one heat map per label
  (``<probe>.csv``, e.g. passkey.csv).
- :func:`tasks_figure`: algorithmic tasks' exact match and token accuracy vs eval size / train size,
  one panel per task and score.

Every artist a reader may look for carries a gid, kept as the ``id`` of its ``<g>`` in the
SVG: ``ours:<line>``, ``paper:<encoding>``, ``interval:<line>``, ``positions:<line>``,
``passkey:<line>``, ``task:<task>:<line>`` and ``interval:<task>:<line>``, and ``train_len``
(``train_size`` in the tasks figure) for the train-length markers. SVG text stays text
(``svg.fonttype: none``), so labels can be searched too.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..eval.results import line_names
from ..runs.rundir import atomic_write

DPI = 120


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path, also_svg: bool = False) -> list[Path]:
    """Write ``fig`` to ``path`` (format from its suffix) and, with ``also_svg``, beside it as
    .svg; both atomically. Closes the figure. -> the files written."""
    plt = _pyplot()
    paths = [Path(path)] + ([Path(path).with_suffix(".svg")] if also_svg else [])
    try:
        with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "posbench"}):
            for p in paths:
                fmt = p.suffix.lstrip(".") or "png"
                meta = {"Date": None} if fmt == "svg" else {}
                atomic_write(p, lambda f: fig.savefig(f, format=fmt, dpi=DPI, metadata=meta))
    finally:
        plt.close(fig)
    return paths


def _colours(names: list[str]) -> dict[str, tuple]:
    """A colour per line name; a zoo (more than 10 lines) gets tab20."""
    plt = _pyplot()
    cycle = plt.get_cmap("tab20").colors if len(names) > 10 else plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {name: cycle[i % len(cycle)] for i, name in enumerate(names)}


def _style(row, index: int = 0) -> dict:
    """RoPE scalings dashed with squares, sliding windows dotted with triangles; plain lines
    past the 20 colours of tab20 dashed, so no two lines look alike."""
    scaled, sliding = row["rope_scaling"] != "none", row["mode"] == "sliding"
    plain = "--" if index >= 20 else "-"
    return {"linestyle": "-." if scaled and sliding else "--" if scaled else ":" if sliding else plain,
            "marker": "^" if sliding else "s" if scaled else "o"}


def _log_axes(ax, x_ticks: list[float], multiples: bool, log_y: bool) -> None:
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log", base=2)
    ax.set_xticks(x_ticks, [f"{t:g}x" if multiples else str(int(t)) for t in x_ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        # label the 2s, 3s and 5s between decades, not every minor tick
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:e}"[0] in "235" else ""))
    ax.grid(True, which="both", alpha=0.3)


INTERVAL_LABEL = "95% interval of each ppl (t over >= 3 seeds, else block bootstrap)"


def _legend(ax, n: int) -> None:
    if n > 10:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize="small")


def _draw_ours(ax, summary: pd.DataFrame, colours: dict, multiples: bool) -> None:
    """One line per name: mean ppl over seeds, its 95% interval shaded (``ppl_ci_low`` ..
    ``ppl_ci_high``, where the summary has one; the legend says which interval), a dashed
    train-length marker."""
    summary = summary.assign(name=line_names(summary))
    many, shaded = summary.name.nunique() > 10, False
    for i, (name, g) in enumerate(summary.groupby("name", sort=False)):
        g = g.sort_values("eval_len")
        x = g.eval_len / g.train_len if multiples else g.eval_len
        line, = ax.plot(x, g.ppl_mean, label=name, color=colours[name], markersize=4 if many else 6,
                        gid=f"ours:{name}", **_style(g.iloc[0], i))
        if "ppl_ci_low" in g and g.ppl_ci_low.notna().any():
            shaded = True
            ax.fill_between(x, g.ppl_ci_low, g.ppl_ci_high, color=line.get_color(), alpha=0.2, linewidth=0,
                            gid=f"interval:{name}")
    if shaded:  # one grey legend entry says what every band is
        ax.fill_between([], [], [], color="gray", alpha=0.2, linewidth=0, label=INTERVAL_LABEL, gid="interval")
    for i, tlen in enumerate([1] if multiples else sorted(summary.train_len.unique())):
        ax.axvline(tlen, color="gray", linestyle="--", linewidth=1, gid="train_len",
                   label="train length" if i == 0 else None)


def _powers_of_two(hi: float) -> list[float]:
    return [2.0 ** k for k in range(0, int(math.ceil(math.log2(max(hi, 1.0)) + 1e-9)) + 1)]


def ppl_figure(summary: pd.DataFrame, reference: pd.DataFrame | None = None, log_y: bool = False):
    """Perplexity vs evaluation length; with ``reference``, a second panel with those
    published numbers (x shared).

    x is the evaluation length as a multiple of the train length, on a log2 scale. The
    question is how far past its training length a model holds up, and the paper trained at
    512 tokens where posbench's quick runs train at 64 or 128: in multiples, both panels put
    the train length at 1x and the same extrapolation factor at the same place, so their
    shapes compare at a glance (the absolute lengths are in the table and the panel titles).
    y is linear by default, so a few percent of drift shows as a slope; ``log_y`` suits a
    figure where one encoding blows up by orders of magnitude."""
    plt = _pyplot()
    names = list(dict.fromkeys(line_names(summary)))
    ref_names = [] if reference is None else [e for e in dict.fromkeys(reference.encoding) if e not in names]
    colours = _colours(names + ref_names)
    many = len(names) > 10
    width = (9.0 if many else 6.4) + (5.6 if reference is not None else 0)
    fig, axes = plt.subplots(1, 2 if reference is not None else 1, figsize=(width, 5.2 if many else 4.4),
                             sharex=True, layout="constrained", squeeze=False)
    ours = axes[0, 0]
    _draw_ours(ours, summary, colours, multiples=True)
    top = float((summary.eval_len / summary.train_len).max())
    tlens = ", ".join(map(str, sorted(summary.train_len.unique())))
    ours.set_title(f"posbench (train_len={tlens})")
    ours.set_ylabel("perplexity")
    _legend(ours, len(names))
    if reference is not None:
        paper = axes[0, 1]
        ref = reference.dropna(subset=["ppl"])
        for enc, g in ref.groupby("encoding", sort=False):
            g = g.sort_values("eval_len")
            paper.plot(g.eval_len / g.train_len, g.ppl, marker="o", label=enc, color=colours[enc],
                       gid=f"paper:{enc}")
        paper.axvline(1, color="gray", linestyle="--", linewidth=1, gid="train_len", label="train length")
        source = str(reference.source.dropna().iloc[0]).split(" (")[0] if "source" in reference else "reference"
        paper.set_title(f"{source} (train_len={', '.join(map(str, sorted(reference.train_len.unique())))})",
                        fontsize="medium")
        paper.set_ylabel("perplexity (published)")
        _legend(paper, ref.encoding.nunique())
        top = max(top, float((ref.eval_len / ref.train_len).max()))
    for ax in axes[0]:
        _log_axes(ax, _powers_of_two(top), multiples=True, log_y=log_y)
        ax.set_xlabel("evaluation length / train length")
    return fig


def run_figure(summary: pd.DataFrame, title: str | None = None):
    """One run (or any summary) in absolute tokens: perplexity vs evaluation length, log2 x,
    dashed line at the train length."""
    plt = _pyplot()
    names = list(dict.fromkeys(line_names(summary)))
    many = len(names) > 10
    fig, ax = plt.subplots(figsize=(9.0, 5.2) if many else (6.4, 4.2), layout="constrained")
    _draw_ours(ax, summary, _colours(names), multiples=False)
    _log_axes(ax, sorted(summary.eval_len.unique()), multiples=False, log_y=False)
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity")
    tlens = ", ".join(map(str, sorted(summary.train_len.unique())))
    ax.set_title(title or f"perplexity vs length (train_len={tlens})")
    _legend(ax, len(names))
    return fig


def positions_figure(positions: pd.DataFrame, log_y: bool = False):
    """Mean NLL (over seeds, weighted by tokens) vs position in the window, one line per
    label, each at its longest evaluated window. x is the 1-based position of the predicted
    token (bin midpoints), log2 scale, so the first positions, where the loss falls fastest,
    get room; the dashed line marks the train length, past which the model never saw a
    position in training."""
    plt = _pyplot()
    positions = positions.assign(name=line_names(positions))
    longest = int(positions.eval_len.max())
    names = list(dict.fromkeys(positions.name))
    colours = _colours(names)
    fig, ax = plt.subplots(figsize=(9.0, 5.2) if len(names) > 10 else (6.4, 4.2), layout="constrained")
    for name, g in positions.groupby("name", sort=False):
        g = g[g.eval_len == g.eval_len.max()]
        weight = g.tokens if "tokens" in g else pd.Series(1.0, index=g.index)
        g = g.assign(weighted=g.nll * weight, weight=weight)
        bins = g.groupby(["bin_start", "bin_end"])[["weighted", "weight"]].sum().reset_index()
        x = (bins.bin_start + bins.bin_end) / 2 + 1
        length = int(g.eval_len.iloc[0])
        ax.plot(x, bins.weighted / bins.weight, marker=".", color=colours[name], gid=f"positions:{name}",
                linestyle=_style(g.iloc[0])["linestyle"], label=name if length == longest else f"{name} (L={length})")
    for i, tlen in enumerate(sorted(positions.train_len.unique())):
        ax.axvline(tlen, color="gray", linestyle="--", linewidth=1, gid="train_len",
                   label="train length" if i == 0 else None)
    _log_axes(ax, _powers_of_two(longest), multiples=False, log_y=log_y)
    ax.set_xlabel("position in the window (tokens, 1 = first predicted token)")
    ax.set_ylabel("mean NLL (nats)")
    ax.set_title(f"loss by position (window L={longest})")
    _legend(ax, len(names))
    return fig


def probe_figure(rows: pd.DataFrame, name: str, metric: str = "accuracy", grid: str | None = None):
    """A probe's ``metric`` (a score in [0, 1]) by sequence length (x) and, where the probe has
    a ``grid`` key (passkey: the depth of the key, 0 = start), by that key (y), one heat map per
    label; without one, one row per label. Cells pool seeds: correct / trials where the rows
    count them, else the mean. Grey cells could not run; the dashed line sits after the last
    length <= train length. SVG ids: ``<name>:<label>``."""
    plt = _pyplot()
    rows = rows.assign(label=line_names(rows), _grid=rows[grid] if grid else "")
    bad = rows.status.fillna("ok") != "ok" if "status" in rows else pd.Series(False, index=rows.index)
    counted = {"correct", "trials"} <= set(rows)
    rows = rows.assign(**({"correct": rows.correct.where(~bad), "trials": rows.trials.where(~bad)} if counted
                          else {metric: rows[metric].where(~bad)}))
    names = list(dict.fromkeys(rows.label))
    cols = min(len(names), 4)
    nrows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.2 * cols + 1.0, (2.8 if grid else 1.6) * nrows), squeeze=False,
                             layout="constrained")
    cmap = plt.get_cmap("RdYlGn").with_extremes(bad="lightgray")
    image = None
    for ax, label in zip(axes.flat, names):
        g = rows[rows.label == label]
        if counted:
            cells = g.groupby(["_grid", "length"])[["correct", "trials"]].sum(min_count=1)
            score = (cells.correct / cells.trials).unstack("length")  # (grid, length)
        else:
            score = g.groupby(["_grid", "length"])[metric].mean().unstack("length")
        values = score.to_numpy(dtype=float)
        image = ax.imshow(values, cmap=cmap, vmin=0, vmax=1, aspect="auto", gid=f"{name}:{label}")
        if score.size <= 80:
            for (i, j), v in np.ndenumerate(values):
                ax.text(j, i, "n/a" if math.isnan(v) else f"{v:.0%}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(score.shape[1]), [str(int(n)) for n in score.columns], rotation=45, fontsize="small")
        ax.set_yticks(range(score.shape[0]), [f"{d:g}" for d in score.index] if grid else [""], fontsize="small")
        inside = [j for j, n in enumerate(score.columns) if n <= g.train_len.max()]
        if inside and inside[-1] < score.shape[1] - 1:
            ax.axvline(inside[-1] + 0.5, color="black", linestyle="--", linewidth=1, gid="train_len")
        ax.set_title(label, fontsize="medium")
        ax.set_xlabel("length (tokens)")
        if grid:
            ax.set_ylabel(grid)
    used = list(axes.flat)[:len(names)]
    for ax in list(axes.flat)[len(names):]:
        fig.delaxes(ax)
    fig.colorbar(image, ax=used, label=f"{name} {metric}", shrink=0.9)
    return fig


def passkey_figure(passkey: pd.DataFrame):
    """Passkey retrieval accuracy by length x depth (:func:`probe_figure`)."""
    return probe_figure(passkey, "passkey", "accuracy", "depth")


TASK_INTERVAL_LABEL = "95% interval (t over >= 3 seeds, else over instances)"


TASK_SCORES = (  # column, interval prefix, line gid, band gid, y label
    ("exact_match", "exact", "task", "interval", "exact match (%)"),
    ("token_acc", "token", "token", "token_interval", "token accuracy (%)"))


def tasks_figure(summary: pd.DataFrame):
    """Accuracy (%) vs eval size as a multiple of the train size (log2 x), one panel per task:
    exact match in the upper panels, per-token accuracy in the lower ones (beyond the training
    size exact match is often 0 for every line, and token accuracy still tells them apart). One
    line per label (:mod:`posbench.report.tasks`) with its 95% interval shaded. A label has one
    colour in every panel; lines trained on randomized positions are dashed with squares; the
    dashed grey line marks the train size (1x). One legend for all panels."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    plt = _pyplot()
    tasks, names = list(dict.fromkeys(summary.task)), list(dict.fromkeys(summary.label))
    colours = _colours(names)
    cols = min(len(tasks), 4)
    block = math.ceil(len(tasks) / cols)  # rows of panels per score
    fig, axes = plt.subplots(2 * block, cols, figsize=(3.4 * cols + 2.6, 3.0 * 2 * block), squeeze=False,
                             sharey=True, layout="constrained")
    handles: dict[str, object] = {}
    for b, (column, prefix, gid, band, ylabel) in enumerate(TASK_SCORES):
        panels = list(axes[b * block:(b + 1) * block].flat)
        for ax, task in zip(panels, tasks):
            g = summary[summary.task == task]
            for name, h in g.groupby("label", sort=False):
                h = h.sort_values("multiple")
                rand = bool((h.random_positions > 0).any())
                handles[name], = ax.plot(h.multiple, 100 * h[column], color=colours[name], label=name,
                                         linestyle="--" if rand else "-", marker="s" if rand else "o", markersize=5,
                                         gid=f"{gid}:{task}:{name}")
                if h[f"{prefix}_lo"].notna().any():
                    ax.fill_between(h.multiple, 100 * h[f"{prefix}_lo"], 100 * h[f"{prefix}_hi"],
                                    color=colours[name], alpha=0.15, linewidth=0,
                                    gid=f"{band}:{task}:{name}")
            ax.axvline(1, color="gray", linestyle="--", linewidth=1, gid="train_size")
            _log_axes(ax, sorted(set(g.multiple) | {1}), multiples=True, log_y=False)
            ax.set_xlim(0.8, 1.25 * max(float(g.multiple.max()), 1.0))
            ax.set_ylim(-3, 103)
            ax.set_title(f"{task} (train size {', '.join(map(str, sorted(g.train_size.unique())))})",
                         fontsize="medium")
            ax.set_xlabel("eval size / train size")
        for ax in axes[b * block:(b + 1) * block, 0]:
            ax.set_ylabel(ylabel)
        for ax in panels[len(tasks):]:
            fig.delaxes(ax)
    extra = [Line2D([], [], color="gray", linestyle="--", linewidth=1, label="train size"),
             Patch(color="gray", alpha=0.15, linewidth=0, label=TASK_INTERVAL_LABEL)]
    fig.legend(handles=[*handles.values(), *extra], loc="outside right upper", fontsize="small")
    return fig
