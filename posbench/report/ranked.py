"""Reports of many lines: one point per line, not one curve.

Past :data:`MANY_LINES` lines a perplexity-vs-length panel cannot be read: colours repeat, and
thirty lines that hold up share one band. So the report draws, from the summary
(:func:`posbench.report.summary.summarize`), one point per line:

- :func:`ranked_figure` (``ranked.png``): each line's ratio ppl(M x) / ppl(1x) and its ppl at 1x,
  each with its 95% interval, the lines grouped by family (the hook the encoding uses,
  :meth:`posbench.encodings.PositionEncoding.hook_kind`; an encoding the registry does not know
  goes by its name's prefix) and sorted by ratio within a family;
- :func:`tradeoff_figure` (``tradeoff.png``): ppl at 1x against the ratio at M x, with both
  intervals as bars and every point labelled, a second panel enlarging the lines that hold up
  (ratio <= :data:`ZOOM_RATIO`) where others do not; a ratio axis that reaches past 3 is linear
  up to 1.5 and logarithmic beyond (:func:`ratio_axis`), so the lines that hold up get the room;

and keeps the per-line figures (perplexity vs length, loss by position, training curves) for the
lines the user names (``--lines``) or that :func:`pick_lines` picks: the lowest ppl at M x, the
lowest and the highest ratio, and the baselines (:data:`BASELINES`). M is the longest multiple of
the train length every line was evaluated at (:func:`common_multiple`): 16x in the zoo.

SVG ids: ``ranked_ratio:<line>``, ``ranked_ppl:<line>``, ``tradeoff:<line>``, ``family:<family>``,
``ratio_one``, ``zoom`` (the zoomed region's frame) and ``setup``.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

import numpy as np
import pandas as pd

from ..config import split_outside_brackets
from ..errors import PosbenchError
from ..eval.results import compact_names
from .encoding_table import BREAKS, HOLDS
from .figures import CLIPPED_NOTE, Palette, _caption, _pyplot

MANY_LINES = 8  # more lines than this: ranked.png and tradeoff.png, and report.png for picked lines only
BASELINES = ("alibi", "nope", "rope", "sinusoidal", "t5")  # the headline's five (results/headline)
ZOOM_RATIO = HOLDS  # tradeoff.png's enlarged panel: the lines whose ratio is at most this (the encoding table's "yes")
FAMILIES = {  # hook -> what the ranked figure calls the family, in the order it lists them when tied
    "none": "no position encoding", "embed": "absolute (embed)", "rotate": "rotary (rotate)",
    "bias": "additive bias (bias)", "score": "content-dependent (score)", "decay": "forget gate (decay)",
    "transition": "Householder transforms (transition)", "normalize": "normalized attention (normalize)",
    "features": "position features (features)"}
VERDICTS = (HOLDS, BREAKS)  # the encoding table's bounds: yes <= 1.05 < partly <= 1.5 < no


def family(encoding: str) -> str:
    """The hook an encoding uses ('bias', 'rotate', ...: ``posbench encodings``' hook column), or,
    for one the registry does not know, its name up to the first '_' ('kerple' for 'kerple_x')."""
    from ..encodings import REGISTRY

    cls = REGISTRY.get(encoding)
    return cls.hook_kind() if cls is not None else re.split(r"[_\-+ ]", encoding, maxsplit=1)[0]


def common_multiple(summary: pd.DataFrame, names: pd.Series) -> float:
    """The longest multiple eval_len / train_len every line was evaluated at (with or without a
    ppl: a learned table that cannot run there still has the row), else the longest of all. A
    line with no row at train_len (sliding rows kept for LongPPL's short contexts, at one length
    or several) has no ratio to rank and does not narrow the choice."""
    multiple = summary.eval_len / summary.train_len
    per_line = [set(m) for _, m in multiple.groupby(names, sort=False)]
    per_line = [m for m in per_line if 1.0 in m and len(m) > 1] or per_line
    common = set.intersection(*per_line) if per_line else set()
    return float(max(common)) if common else float(multiple.max())


def line_points(summary: pd.DataFrame, names: pd.Series) -> pd.DataFrame:
    """One row per line (``names``: each summary row's line name, the report's palette names):
    ``name``, ``short`` (the name as legends show it, :func:`compact_names`), ``setup`` (what the
    short name's label adds to its encoding: '' for 'rope', ' [steps=4883]'), ``unless`` (what the
    short names leave out, :func:`compact_names`), ``encoding``,
    ``family``, ``multiple`` (M, :func:`common_multiple`), ``ppl``, ``ppl_low``, ``ppl_high`` (at
    1x), ``ratio``, ``ratio_low``, ``ratio_high`` and ``ppl_at`` (at M x; NaN where the line cannot
    run there) and ``one_seed`` (its intervals leave the seeds' spread out)."""
    m = common_multiple(summary, names)
    rows_named = summary.assign(name=names.to_numpy())
    shorts, unless = compact_names(rows_named)
    suffix = {name: name[len(label):] for name, label in zip(rows_named.name, rows_named.label)}  # (train_len=64)

    def get(frame: pd.DataFrame, col: str) -> float:
        return float(frame[col].iloc[0]) if len(frame) and col in frame else math.nan

    rows = []
    for name, g in summary.assign(_name=names.to_numpy()).groupby("_name", sort=False):
        multiple = g.eval_len / g.train_len
        base, at = g[multiple == 1], g[np.isclose(multiple, m)]
        short, encoding = shorts[name], str(g.encoding.iloc[0])
        label = short[:len(short) - len(suffix[name])]  # the short name without what line_names added
        rows.append({"name": name, "short": short, "encoding": encoding, "unless": unless,
                     "setup": label[len(encoding):] if label.startswith(encoding) else None,
                     "family": family(str(g.encoding.iloc[0])), "multiple": m,
                     "ppl": get(base, "ppl_mean"), "ppl_low": get(base, "ppl_ci_low"),
                     "ppl_high": get(base, "ppl_ci_high"), "ratio": get(at, "ratio_mean"),
                     "ratio_low": get(at, "ratio_ci_low"), "ratio_high": get(at, "ratio_ci_high"),
                     "ppl_at": get(at, "ppl_mean"),
                     "one_seed": (bool(len(base) and base.ci_method.iloc[0] == "text (1 seed)")
                                  if "ci_method" in g else False)})
    return pd.DataFrame(rows)


def split_names(values: list[str]) -> list[str]:
    """``--lines`` values -> line names: each value split at commas outside brackets, so
    'alibi,rope [window=128]' and 'rope [qk_norm=True, window=0]' both read as meant."""
    return [name for value in values for name in split_outside_brackets(value)]


def named_lines(points: pd.DataFrame, named: list[str]) -> dict[str, str]:
    """The lines ``named`` (by their full name or as the legends show it) -> 'named with --lines',
    in the report's line order; an unknown name is refused with the valid ones."""
    lookup = {**dict(zip(points.short, points.name)), **dict(zip(points.name, points.name))}
    unknown = [n for n in named if n not in lookup]
    if unknown:
        raise PosbenchError(f"report: --lines {unknown[0]!r} is not a line of this report; valid: "
                            + ", ".join(points.short))
    chosen = {lookup[n] for n in named}
    return {name: "named with --lines" for name in points.name if name in chosen}  # in the report's order


def pick_lines(points: pd.DataFrame) -> dict[str, str]:
    """The lines a report of many draws per line, each with why: the lowest ppl at M x, the lowest
    and the highest ratio ppl(M x) / ppl(1x) (among the lines that run there), and the baselines
    (:data:`BASELINES`), in the report's line order.

    A baseline is found by its encoding, not by its label: of the lines of a baseline encoding, its
    plain lines (the name, as legends show it, is the encoding, up to a '(model=...)'-style note),
    else those in the setup of the
    lowest ppl at M x (what its name adds to its encoding: ' [steps=4883]' in a budget study), so a
    study whose every label carries a setup keeps its baselines, each compared within one setup."""
    ok, m = points.dropna(subset=["ratio", "ppl_at"]), f"{points.multiple.iloc[0]:g}x"
    why: dict[str, str] = {}
    if len(ok):
        for name, text in ((ok.loc[ok.ppl_at.idxmin(), "name"], f"lowest ppl at {m}"),
                           (ok.loc[ok.ratio.idxmin(), "name"], f"lowest ratio at {m}"),
                           (ok.loc[ok.ratio.idxmax(), "name"], f"highest ratio at {m}")):
            why[name] = f"{why[name]}, {text}" if name in why else text
    setups = points.setup
    best = setups[ok.ppl_at.idxmin() if len(ok) else points.index[0]]
    for encoding in BASELINES:
        mine = setups[points.encoding == encoding]
        for wanted in ("", best):
            if wanted is not None and (mine == wanted).any():
                for name in points.name[mine.index[mine == wanted]]:  # one a model or train_len, as legends say
                    why.setdefault(name, "baseline")
                break
    return {name: why[name] for name in points.name if name in why}


# ---------------------------------------------------------------- drawing
def family_colours(points: pd.DataFrame) -> dict[str, object]:
    """One tab10 colour per family, the hooks in :data:`FAMILIES`' order, then any prefix families."""
    plt = _pyplot()
    cycle = plt.get_cmap("tab10").colors
    known = [f for f in FAMILIES if f in set(points.family)] + sorted(set(points.family) - set(FAMILIES))
    return {f: cycle[i % len(cycle)] for i, f in enumerate(known)}


def _limits(values: pd.Series, lows: pd.Series | None = None, highs: pd.Series | None = None,
            log: bool = False, include: tuple[float, ...] = ()) -> tuple[float, float]:
    """Axis limits that fit ``values`` (and ``include``) with a little room, and the interval ends
    ``lows`` / ``highs`` that lie within a factor of 2 of them: an interval of two seeds that
    disagree (0 .. 1e6) is cut at the axes (:func:`_bar`), not allowed to flatten every point."""
    v = pd.concat([values.dropna(), pd.Series(include, dtype=float)])
    near = v.min() / 2, v.max() * 2
    for ends in (lows, highs):
        if ends is not None:
            ends = ends.dropna()
            v = pd.concat([v, ends[(ends > near[0]) & (ends < near[1])]])
    to, back = (np.log, np.exp) if log else (float, float)
    lo, hi = to(v.min()), to(v.max())
    spare = max(0.04 * (hi - lo), np.log(1.01) if log else 0.01 * abs(hi))
    return float(back(lo - spare)), float(back(hi + spare))


def _bar(ax, at: float, low: float, high: float, lims: tuple[float, float], colour, vertical: bool, gid: str,
         faint: bool = False) -> bool:
    """An interval ``low`` .. ``high`` at ``at`` (y for a horizontal bar), cut at ``lims``, with an
    arrow head where it runs past them; ``faint``: thin and light. -> whether it was cut."""
    if math.isnan(low) or math.isnan(high):
        return False
    a, b = max(low, lims[0]), min(high, lims[1])
    draw = ax.vlines if vertical else ax.hlines
    draw(at, a, b, color=colour, linewidth=0.8 if faint else 1.4, alpha=0.35 if faint else 0.8, gid=gid)
    cut = False
    for end, past, marker in ((a, low < lims[0], "v" if vertical else "<"),
                              (b, high > lims[1], "^" if vertical else ">")):
        if past:
            cut = True
            xy = (at, end) if vertical else (end, at)
            ax.plot(*xy, marker=marker, color=colour, markersize=4, alpha=0.35 if faint else 0.8, clip_on=False,
                    gid=gid)
    return cut


BEND = 1.5  # a ratio axis reaching past 2 * BEND is linear up to BEND and logarithmic beyond (ratio_axis)
BEND_LOG = 0.25  # axis units per e-fold past BEND: 1.5 .. 15 take about as much room as 0.95 .. 1.5


def _bent(x):
    x = np.asarray(x, dtype=float)
    return np.where(x <= BEND, x, BEND + BEND_LOG * np.log(np.maximum(x, BEND) / BEND))


def _unbent(y):
    y = np.asarray(y, dtype=float)
    return np.where(y <= BEND, y, BEND * np.exp((np.maximum(y, BEND) - BEND) / BEND_LOG))


def ratio_axis(ax, which: str, lims: tuple[float, float]) -> str:
    """Set a ratio axis (``which``: 'x' or 'y') to ``lims``. The ratios of lines that hold up
    differ in the second decimal and those of lines that break by orders of magnitude: where
    the axis reaches past 2 x :data:`BEND` it is linear up to BEND (1.5, the bound of
    the encoding table's "partly") and logarithmic beyond, the logarithmic part shaded; else
    linear. Ticks at 1, 1.05, 1.1, ... and 2, 3, 5, 10, ... as they fit. -> the axis label's
    note on its scale ('' for a linear one)."""
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator

    axis, span = (ax.xaxis, ax.axvspan) if which == "x" else (ax.yaxis, ax.axhspan)
    bent = lims[1] > 2 * BEND
    if bent:
        (ax.set_xscale if which == "x" else ax.set_yscale)("function", functions=(_bent, _unbent))
        span(BEND, lims[1], color="0.93", zorder=0, linewidth=0)
    (ax.set_xlim if which == "x" else ax.set_ylim)(*lims)
    ticks = _ratio_ticks(lims, bent, room=0.05 if which == "x" else 0.03)
    if not bent and len(ticks) < 4:  # a narrow linear axis (the lines that hold up): matplotlib's own ticks
        return ""
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FixedFormatter([f"{t:g}" for t in ticks]))
    axis.set_minor_locator(NullLocator())
    return f"linear to {BEND:g}, logarithmic beyond (shaded)" if bent else ""


TICK_PRIORITY = (1, 1.5, 2, 5, 10, 100, 1000, 10000, 1.1, 1.2, 0.9, 0.8, 0.5, 3, 20, 50, 1.05, 0.95, 1.3, 1.4)


def _ratio_ticks(lims: tuple[float, float], bent: bool, room: float) -> list[float]:
    """The ticks of a ratio axis, taken in :data:`TICK_PRIORITY` order while each keeps ``room``
    (a fraction of the axis) from those taken, so that their labels do not overlap."""
    to = _bent if bent else (lambda x: np.asarray(x, dtype=float))
    span = float(to(lims[1]) - to(lims[0]))
    taken: list[float] = []
    for t in TICK_PRIORITY:
        if lims[0] <= t <= lims[1] and all(abs(float(to(t) - to(u))) >= room * span for u in taken):
            taken.append(t)
    return sorted(taken)


def _ranked_order(points: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Families ordered by their lowest ratio (a family that cannot run at M x last), each family's
    lines by ratio, the lines that cannot run last."""
    groups = [(f, g.sort_values(["ratio", "ppl"], na_position="last")) for f, g in points.groupby("family", sort=False)]
    return sorted(groups, key=lambda fg: (fg[1].ratio.min() if fg[1].ratio.notna().any() else math.inf,
                                          list(FAMILIES).index(fg[0]) if fg[0] in FAMILIES else len(FAMILIES)))


def ranked_figure(points: pd.DataFrame, setup: pd.DataFrame | None = None):
    """Per line, ppl(M x) / ppl(1x) (left; :func:`ratio_axis`) and ppl at 1x (right), each a
    point with its 95% interval as a bar (cut at the axes with an arrow head), one row per line,
    the lines grouped by family and sorted by ratio within it; hollow points: one seed (the
    text's spread only). Dotted lines mark 1.05 and 1.5, the bounds of
    the encoding table's verdicts (posbench.report.encoding_table)."""
    plt = _pyplot()
    colours, order = family_colours(points), _ranked_order(points)
    m = f"{points.multiple.iloc[0]:g}x"
    rows = len(points) + len(order)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.0, 0.24 * rows + 2.0), sharey=True, layout="constrained",
                                      gridspec_kw={"width_ratios": [1.35, 1.0]})
    rlims = _limits(points.ratio, points.ratio_low, points.ratio_high, log=True, include=(1.0,))
    plog = points.ppl.max() > 3 * points.ppl.min()
    plims = _limits(points.ppl, points.ppl_low, points.ppl_high, log=plog)
    scale = ratio_axis(left, "x", rlims)
    right.set_xlim(*plims)
    if plog:
        right.set_xscale("log")
    ticks, labels, heads, y, cut = [], [], [], 0, {left: False, right: False}
    for fam, g in order:
        ticks.append(y)
        labels.append(FAMILIES.get(fam, fam))
        heads.append(True)
        y += 1
        for r in g.itertuples():
            colour, face = colours[fam], "white" if r.one_seed else colours[fam]
            for ax, value, low, high, lims, gid in ((left, r.ratio, r.ratio_low, r.ratio_high, rlims, "ranked_ratio"),
                                                    (right, r.ppl, r.ppl_low, r.ppl_high, plims, "ranked_ppl")):
                if math.isnan(value):
                    ax.text(lims[0], y, f"  cannot run at {m}", va="center", fontsize="small", color="gray",
                            gid=f"{gid}:{r.name}")
                    continue
                cut[ax] |= _bar(ax, y, low, high, lims, colour, vertical=False, gid=f"{gid}:{r.name}")
                ax.plot(value, y, "o", color=colour, markerfacecolor=face, markersize=5, gid=f"{gid}:{r.name}")
            ticks.append(y)
            labels.append(r.short)
            heads.append(False)
            y += 1
    for ax in (left, right):
        ax.grid(True, axis="x", which="major", alpha=0.3)
    left.axvline(1, color="black", linewidth=0.8, gid="ratio_one")
    for bound in VERDICTS:
        if rlims[0] < bound < rlims[1]:
            left.axvline(bound, color="gray", linestyle=":", linewidth=1)
    left.set_yticks(ticks, labels, fontsize="small")
    for tick, head in zip(left.get_yticklabels(), heads):
        if head:
            tick.set_fontweight("bold")
    left.set_ylim(y - 0.5, -0.5)
    note = {ax: f"\n({CLIPPED_NOTE})" if was else "" for ax, was in cut.items()}
    left.set_xlabel(f"ppl({m}) / ppl(1x) with its 95% interval; dotted: 1.05 and 1.5"
                    + (f"\n(axis {scale})" if scale else "") + note[left])
    right.set_xlabel(f"perplexity at train_len (1x) with its 95% interval{note[right]}")
    left.set_title(f"how far each line holds up: ppl({m}) / ppl(1x)", fontsize="medium")
    right.set_title("how good it is where it trained", fontsize="medium")
    _caption(fig, setup, "lines grouped by the hook their encoding uses, sorted by ratio; hollow: one seed")
    return fig


def tradeoff_figure(points: pd.DataFrame, setup: pd.DataFrame | None = None):
    """ppl at 1x (x) against ppl(M x) / ppl(1x) (y, :func:`ratio_axis`), one labelled point per line
    with both 95% intervals as bars (cut at the axes with an arrow head; the ppl's faint: it is
    mostly the text's spread, which every line shares); lower left is better on both. Where three
    or more lines hold up (ratio <= :data:`ZOOM_RATIO`) and others do not, a second panel enlarges
    those, where they are labelled, and the first frames that region. Lines that cannot run at
    M x are named in the caption."""
    plt = _pyplot()
    colours = family_colours(points)
    ok = points.dropna(subset=["ratio", "ppl"])
    m = f"{points.multiple.iloc[0]:g}x"
    close = ok[ok.ratio <= ZOOM_RATIO]
    zoomed = 3 <= len(close) < len(ok)
    fig, axes = plt.subplots(1, 2 if zoomed else 1, figsize=(15.0 if zoomed else 8.5, 7.5), layout="constrained",
                             squeeze=False)
    panels = [(axes[0, 0], ok, True)] + ([(axes[0, 1], close, False)] if zoomed else [])
    cut = False
    for ax, shown, whole in panels:
        xl = _limits(shown.ppl, shown.ppl_low, shown.ppl_high)
        # the enlarged panel fits its points alone: one wide interval would undo the enlargement
        yl = _limits(shown.ratio, *((shown.ratio_low, shown.ratio_high) if whole else ()), log=True,
                     include=(1.0,) if whole else ())
        ax.set_xlim(*xl)
        scale = ratio_axis(ax, "y", yl)
        ax.axhline(1, color="black", linewidth=0.8, gid="ratio_one")
        for bound in VERDICTS:
            if yl[0] < bound < yl[1]:
                ax.axhline(bound, color="gray", linestyle=":", linewidth=1)
        for r in shown.itertuples():
            colour = colours[r.family]
            cut |= _bar(ax, r.ppl, r.ratio_low, r.ratio_high, yl, colour, vertical=True, gid=f"tradeoff:{r.name}")
            cut |= _bar(ax, r.ratio, r.ppl_low, r.ppl_high, xl, colour, vertical=False, gid=f"tradeoff:{r.name}",
                        faint=True)
            ax.plot(r.ppl, r.ratio, "o", color=colour, markerfacecolor="white" if r.one_seed else colour,
                    markersize=6, gid=f"tradeoff:{r.name}", zorder=3)
        ax.set_xlabel("perplexity at train_len (1x)")
        ax.set_ylabel(f"ppl({m}) / ppl(1x)" + (f" (axis {scale})" if scale else ""))
        ax.grid(True, which="major", alpha=0.3)
    big = axes[0, 0]
    if zoomed:
        from matplotlib.patches import Rectangle

        xl, yl = axes[0, 1].get_xlim(), axes[0, 1].get_ylim()
        big.add_patch(Rectangle((xl[0], yl[0]), xl[1] - xl[0], yl[1] - yl[0], fill=False, linestyle="--",
                                edgecolor="gray", gid="zoom"))
        big.set_title("every line; the dashed frame is enlarged on the right", fontsize="medium")
        axes[0, 1].set_title(f"the lines that hold up: ratio <= {ZOOM_RATIO:g}", fontsize="medium")
        label_points(axes[0, 1], close)
        label_points(big, ok[ok.ratio > ZOOM_RATIO])
    else:
        big.set_title("quality where trained against extrapolation (lower left is better)", fontsize="medium")
        label_points(big, ok)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker="o", linestyle="none", color=colours[f], label=FAMILIES.get(f, f),
                      gid=f"family:{f}")
               for f in colours]
    fig.legend(handles=handles, fontsize="small", loc="outside lower center", ncols=min(len(handles), 4),
               title="family: the hook the encoding uses", title_fontsize="small")
    missing = points[points.ratio.isna() | points.ppl.isna()]
    more = [f"cannot run at {m}: {', '.join(missing.short)}" if len(missing) else "",
            ("bars: 95% intervals (the faint ppl bars are mostly the text's spread, which every line shares); "
             "hollow: one seed; dotted: 1.05 and 1.5"), CLIPPED_NOTE if cut else ""]
    _caption(fig, setup, *[t for t in more if t])
    return fig


def label_points(ax, shown: pd.DataFrame) -> None:
    """Each point's short name beside it (right, else left), moved up or down until it overlaps no
    other label or marker, with a grey leader line when it moved: greedy, in display space, once
    the layout is fixed. Points are taken from the top."""
    fig = ax.figure
    fig.canvas.draw()  # the constrained layout places the axes: display coordinates hold from here
    renderer = fig.canvas.get_renderer()
    points = [ax.transData.transform((r.ppl, r.ratio)) for r in shown.itertuples()]
    taken = [(x - 4, y - 4, x + 4, y + 4) for x, y in points]  # the markers
    frame = ax.get_window_extent(renderer)
    per_point = fig.dpi / 72  # display pixels per typographic point
    for (x, y), r in sorted(zip(points, shown.itertuples()), key=lambda p: -p[0][1]):
        probe = ax.text(0, 0, r.short, fontsize=7.5)
        box = probe.get_window_extent(renderer)
        probe.remove()
        w, h = box.width, box.height
        place = None
        for dy in [0.0, *[s * k * (h + 1) for k in range(1, 40) for s in (1, -1)]]:
            for dx in (6.0, -6.0 - w):
                cand = (x + dx, y + dy - h / 2, x + dx + w, y + dy + h / 2)
                inside = frame.x0 <= cand[0] and cand[2] <= frame.x1 and frame.y0 <= cand[1] and cand[3] <= frame.y1
                if inside and not any(_overlap(cand, t) for t in taken):
                    place = (dx, dy, cand)
                    break
            if place:
                break
        dx, dy, cand = place or (6.0, 0.0, (x + 6, y - h / 2, x + 6 + w, y + h / 2))
        arrow = {"arrowstyle": "-", "color": "gray", "linewidth": 0.5, "shrinkA": 0, "shrinkB": 3,
                 "relpos": (0, 0.5) if dx > 0 else (1, 0.5)} if abs(dy) > h / 2 else None
        ax.annotate(r.short, (r.ppl, r.ratio), xytext=(dx / per_point, dy / per_point), textcoords="offset points",
                    fontsize=7.5, va="center", ha="left", arrowprops=arrow, gid=f"tradeoff_label:{r.name}")
        taken.append(cand)


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


class Shown(NamedTuple):
    """Which lines a report's per-line figures draw (:func:`choose_lines`)."""
    points: pd.DataFrame  # one row per line (line_points); empty where neither many nor named
    why: dict[str, str]  # the lines drawn, each with why; empty: every line
    palette: Palette  # the report's colours, the lines drawn first
    many: bool  # more than MANY_LINES lines: ranked.png and tradeoff.png
    named: bool  # the lines were named with --lines

    def keep(self, frame: pd.DataFrame, col: str | None = None) -> pd.DataFrame:
        """The rows of ``frame`` on the lines drawn (their name in ``col``, else the palette's)."""
        if not self.why or frame.empty:
            return frame
        return frame[(frame[col] if col else self.palette.names(frame)).isin(list(self.why))]

    def figures(self, setup: pd.DataFrame | None) -> dict:
        """ranked.png and tradeoff.png where the report has many lines and some line has both its
        ratio and its ppl at 1x to place, else none (lines evaluated at lengths no other line
        shares have no common multiple, so no ratio)."""
        if not self.many or self.points.dropna(subset=["ratio", "ppl"]).empty:
            return {}
        return {"ranked": ranked_figure(self.points, setup), "tradeoff": tradeoff_figure(self.points, setup)}

    def texts(self, said: dict[str, str]) -> dict[str, str]:
        """report.md's lines under the figures: 'Mx' made the multiple, report.png's naming its lines."""
        if self.many:
            said = {k: v.replace("Mx", f"{self.points.multiple.iloc[0]:g}x") for k, v in said.items()}
        if self.why:
            said = {**said, "report": f"{said['report']} {picked_text(self.why, self.points, self.named)}"}
        return said


def choose_lines(summary: pd.DataFrame, lines: list[str] = ()) -> Shown:
    """The lines the per-line figures of a report of ``summary`` draw: those ``lines`` names
    (:func:`split_names`, :func:`named_lines`), else, past :data:`MANY_LINES`, those
    :func:`pick_lines` picks, else all; and the palette that gives them the first colours."""
    names = Palette(summary).names(summary)
    many = names.nunique() > MANY_LINES
    points = line_points(summary, names) if many or lines else pd.DataFrame()
    why = named_lines(points, split_names(list(lines))) if lines else pick_lines(points) if many else {}
    return Shown(points, why, Palette(summary, only=list(why) or None), many, bool(lines))


def picked_text(why: dict[str, str], points: pd.DataFrame, named: bool) -> str:
    """report.md's line under report.png in a report of many lines: which lines it draws, and why,
    each named as the legends name it, with what those names leave out (``unless shown``)."""
    short = dict(zip(points.name, points.short))
    listed = "; ".join(f"{short[n]} ({w})" for n, w in why.items()) if not named else ", ".join(short[n] for n in why)
    how = "named with --lines" if named else "picked by the report"
    common = points.unless.iloc[0] if len(points) else ""  # what the names leave out, as the legends' titles say
    unless = f" (named as the legends name them; unless shown: {common})" if common else ""
    return (f"report.png (and the per-line figures below it) draws {len(why)} of the {len(points)} "
            f"lines{unless}, {how}: "
            f"{listed}. Every line is in ranked.png and tradeoff.png; `--lines a,b,c` draws others.")


__all__ = ["BASELINES", "MANY_LINES", "ZOOM_RATIO", "Shown", "choose_lines", "common_multiple", "family",
           "line_points", "named_lines", "pick_lines", "picked_text", "ranked_figure", "split_names",
           "tradeoff_figure"]
