"""The report's figures, each a function that takes tidy rows and returns a matplotlib Figure.

- :func:`ppl_figure`: ``report.png``: perplexity vs evaluation length, one line per label (mean
  over seeds, its 95% interval shaded); beside it the ratio ppl(L) / ppl(train_len) with the
  interval of that ratio; and, where the comparison means something (:func:`reference_lines`),
  the published numbers.
- :func:`run_figure`: one run's (or any summary's) perplexity and ratio vs length in tokens
  (``ppl_vs_length.png`` in a run dir).
- :func:`positions_figure`: mean NLL vs position in the window (positions.csv), from bins fed by
  enough windows (:data:`MIN_BIN_WINDOWS`).
- :func:`training_figure`: training loss vs training tokens (each run's metrics.jsonl).
- :func:`probe_figure`: a probe's score by length (x depth for passkey), one heat map per label
  (``<probe>.csv``, e.g. passkey.csv).
- :func:`tasks_figure`: algorithmic tasks' exact match and token accuracy vs eval size / train size,
  one panel per task and score.

A report of more than eight lines also draws one point per line (ranked.png, tradeoff.png:
:mod:`posbench.report.ranked`) and the figures above for some lines only.

A line keeps one colour in every panel and figure of a report: a :class:`Palette` built from the
report's summary hands out colours by line name, and the published panel borrows the colour of
our line of the same encoding. A cell averaged over a different number of seeds than the rest of
its line (:func:`uneven_seeds`) has a hollow marker. Each figure's top line names the setup
behind it (:func:`setup_caption`: model, corpus, steps, training tokens).

Every artist a reader may look for carries a gid, kept as the ``id`` of its ``<g>`` in the
SVG: ``ours:<line>``, ``interval:<line>``, ``seeds:<line>`` (the hollow markers), ``ratio:<line>``,
``ratio_interval:<line>``, ``ratio_seeds:<line>``, ``ratio_one``, ``paper:<encoding>``,
``positions:<line>``, ``training:<line>``, ``training_band:<line>``, ``passkey:<line>``,
``task:<task>:<line>`` and ``interval:<task>:<line>``, ``setup`` for the caption, and
``train_len`` (``train_size`` in the tasks figure) for the train-length markers. SVG text stays
text (``svg.fonttype: none``), so labels can be searched too.
"""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from ..eval.results import LINE, as_trained, compact_names, line_names
from ..runs.rundir import atomic_write

DPI = 120
# positions.png draws a bin only where, per seed, at least MIN_BIN_WINDOWS windows and
# MIN_BIN_TOKENS tokens feed it (per seed, because every seed scores the same text), each line at
# its longest window that feeds one; with none, no figure (report.md says why). How many windows:
# causal attention gives a token at position p < L of a window of L' > L tokens the same context
# as in a window of L, so the bin's mean at L' is its mean over a subset of L's windows, and the
# two differ by the text alone. Over the zoo's and the new schemes' runs (results/baselines/zoo,
# results/new_schemes/runs: 2,000+ such pairs of bins) one window's mean over a bin varies by
# about 0.35 nats for bins of 16 to 512 positions (0.27-0.41 by width: where a window falls in
# the text matters more than how many of its tokens the bin holds) and by about 2 nats for bins
# of 1 to 4 positions. A bin fed by W windows is then uncertain by 0.35 / sqrt(W) nats: 0.09 at
# 16 windows (zoo_quick's L=1024), as large as what the figure is read for (a rise of 0.05-0.1
# nats past train_len is a ratio of 1.05-1.1), and 0.049 = ln 1.05 at 50, the bound of
# the encoding table's "yes". The first bins (1-4 positions) stay noisier (2 / sqrt(W): 0.3 nats
# at 50 windows); MIN_BIN_TOKENS keeps a bin of one position out below 100 windows. And a bin fed
# by one window is one stretch of text, not an average over the text: sliding windows score only
# their last stride tokens, so every bin before L - stride comes from the first window alone,
# which is why those swung between 0.45 and 5.7 nats. Merging such bins would average one
# window's text over positions, a number that belongs to no position; they are left out.
MIN_BIN_TOKENS = 100
MIN_BIN_WINDOWS = 50
# The published panel (Press et al.: 512-token windows, 21.1B training tokens) is drawn only beside
# runs that come within reach of it: windows of at least a quarter of its train length, and at least
# REFERENCE_MIN_TOKENS training tokens in every run of the report. Below that the shapes are not the
# same question: on sotu the matched study's RoPE 16x ratio goes from 2.29 at 5M tokens to 4.86 at
# 20M, so a 0.5M-token quick run drawn beside the paper's curves invites a comparison its budget
# cannot carry. Runs whose training tokens are unknown (no config.yaml) get no panel either.
REFERENCE_MIN_TRAIN_LEN = 128
REFERENCE_MIN_TOKENS = 10_000_000
# legend entries, on two or three lines each so that three panels fit side by side
INTERVAL_LABEL = "95% interval of each ppl\n(seeds and text; 1 seed: text only)"
SEEDS_LABEL = "hollow: another seed count\nthan the rest of its line"
RATIO_METHODS = {"seeds+text": "seeds and text\n(paired by seed and by text block)",
                 "text (1 seed)": "text only, paired blocks\n(1 seed; the seeds' spread not in it)",
                 "t": "paired t over seeds\n(no per-token NLL: the text's spread not in it)"}


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


# ---------------------------------------------------------------- colours, names, captions
class Palette:
    """One colour per figure line for every figure of one report, keyed by line name.

    Built from the report's summary (``lines``: rows with ``label`` and the LINE columns), so the
    names other tables get through :meth:`names` (positions, training curves) carry the same
    suffixes (``(train_len=64)``) and so the same colours, whatever subset of lines they hold.
    Any other key (a published encoding we did not train) gets the next free colour; a zoo (more
    than 10 lines) draws from tab20. ``only``: the names that get colours up front, where a report
    of many lines draws only some of them per line (:mod:`posbench.report.ranked`)."""

    def __init__(self, lines: pd.DataFrame | None = None, extra: list[str] = (), only: list[str] | None = None):
        self._context = None if lines is None else lines[[c for c in LINE if c in lines]].drop_duplicates()
        names = pd.Series(dtype=object) if lines is None else self.names(lines)
        # each line's rows with its name and --by values: what legends shorten names from (compact)
        self._rows = None if lines is None or "label" not in lines else lines.assign(name=names)
        known = list(dict.fromkeys([*names, *extra]))
        if only is not None:  # the lines the per-line figures draw (a report of many): theirs the first colours
            known = [name for name in known if name in set(only)]
        plt = _pyplot()
        self._cycle = plt.get_cmap("tab20").colors if len(known) > 10 else \
            plt.rcParams["axes.prop_cycle"].by_key()["color"]
        self.colours: dict[str, object] = {}
        for name in known:
            self.colour(name)

    def names(self, frame: pd.DataFrame) -> pd.Series:
        """Each row's line name, its suffix chosen over the whole report (:func:`line_names`)."""
        if self._context is None:
            return line_names(frame)
        cols = [c for c in LINE if c in frame and c in self._context]
        both = pd.concat([frame[cols], self._context[cols]], ignore_index=True)
        return pd.Series(line_names(both).iloc[:len(frame)].to_numpy(), index=frame.index, dtype=object)

    def compact(self, names: list[str]) -> tuple[dict[str, str], str]:
        """The line ``names`` shortened by what most of them share (:func:`compact_names`, from the
        lines' data) and what was left out; names the palette has no data of stay as they are."""
        if self._rows is None:
            return {}, ""
        return compact_names(self._rows[self._rows.name.isin(set(names))])

    def colour(self, key: str):
        if key not in self.colours:
            self.colours[key] = self._cycle[len(self.colours) % len(self._cycle)]
        return self.colours[key]


def amount(n) -> str:
    """'330', '5.25M', '0.512M', '21.1B': a parameter or token count for a caption (3 digits)."""
    if n is None or pd.isna(n):
        return "?"
    return f"{int(n):,}" if n < 10_000 else f"{n / 1e6:.3g}M" if n < 1e9 else f"{n / 1e9:.3g}B"


# a GGUF file's quantization as llama.cpp names it, at the end of the model's name (before '+bos'):
# 'gemma-3-270m-q4_k_m', 'SmolLM2-135M-Instruct.Q4_1', '...-f16'
QUANT = re.compile(r"[._-]((?:q|iq)(\d+)(?:_[a-z0-9]+)*|b?f(16|32))(?=$|\+)", re.IGNORECASE)


def quantization(model: str) -> str:
    """'4-bit GGUF Q4_K_M' for a model named after its quantized GGUF file ('gemma-3-270m-q4_k_m'),
    '' for any other name: a caption says what was measured, and a 4-bit quantization's
    perplexity is not its full-precision model's."""
    found = QUANT.search(str(model))
    return f"{found[2] or found[3]}-bit GGUF {found[1].upper()}" if found else ""


def setup_caption(setup: pd.DataFrame) -> str:
    """'model tiny (5.25M params), corpus sotu, 250 steps, 0.512M training tokens': the columns
    ``model``, ``params``, ``data``, ``steps`` and ``train_tokens`` of ``setup`` (one row per run;
    any may be missing), each value once, up to three joined by '/', more counts as 'min..max'
    (a zoo's parameter counts). A pretrained model's 0 steps and tokens (none trained here) are left out,
    and a quantized GGUF model says so (:func:`quantization`: 'model gemma-3-270m-q4_k_m (4-bit GGUF
    Q4_K_M, 268M params)')."""
    def values(col, fmt=str) -> str:
        found = setup[col].dropna() if col in setup else pd.Series([], dtype=object)
        if col in ("steps", "train_tokens"):
            found = found[found > 0]
        shown = list(dict.fromkeys(fmt(v) for v in found))
        if len(shown) > 3 and col != "model" and col != "data":
            return f"{fmt(found.min())}..{fmt(found.max())}"
        return "/".join(shown)

    model, params, data = values("model"), values("params", amount), values("data")
    steps, tokens = values("steps", lambda v: f"{int(v):,}"), values("train_tokens", amount)
    names = setup["model"].dropna().astype(str) if "model" in setup else pd.Series([], dtype=str)
    quants = "/".join(dict.fromkeys(q for q in map(quantization, names) if q))
    size = ", ".join(p for p in (quants, f"{params} params" if params else "") if p)
    parts = [f"model {model}" + (f" ({size})" if size else "") if model else size,
             f"corpus {data}" if data else "", f"{steps} steps" if steps else "",
             f"{tokens} training tokens" if tokens else ""]
    return ", ".join(p for p in parts if p)


def wrapped(text: str, fig) -> str:
    """``text`` in lines as wide as ``fig``: about 14 characters of small text to the inch."""
    return textwrap.fill(text, int(14 * fig.get_figwidth()))


def _caption(fig, setup: pd.DataFrame | None, *more: str) -> None:
    text = "; ".join(t for t in [setup_caption(setup) if setup is not None else "", *more] if t)
    if text:
        fig.suptitle(wrapped(text, fig), fontsize="small", gid="setup")


def _summary_setup(summary: pd.DataFrame) -> pd.DataFrame:
    """What a summary alone says of the setup (no steps or tokens: those are per run)."""
    return summary[[c for c in ("model", "params", "data", "train_len", "steps", "train_tokens") if c in summary]]


def seed_counts(summary: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Each cell's seed count and its line's usual count.

    A cell's count is its ``n_ok`` (the seeds whose ppl it averages; ``seeds`` where the summary
    has no ``n_ok``), NaN where it has no ppl (cannot run); a line's usual count is the most
    common among its cells with a ppl (ties: the larger), its ``seeds`` where it has none."""
    counts = (summary.n_ok if "n_ok" in summary else summary.seeds).where(summary.ppl_mean.notna())
    usual = counts.groupby([summary[c] for c in LINE if c in summary], dropna=False).transform(_usual)
    return counts, usual.fillna(summary.seeds)


def _usual(counts: pd.Series) -> float:
    found = counts.dropna().value_counts()
    return math.nan if found.empty else float(found[found == found.max()].index.max())


def uneven_seeds(summary: pd.DataFrame) -> pd.Series:
    """True for a cell averaged over a different number of seeds than the rest of its line
    (:func:`seed_counts`): a line with 2 seeds up to 16x and 1 at 32x jumps at 32x for that
    reason alone, so the figures draw that cell hollow and the table names its count."""
    counts, usual = seed_counts(summary)
    return (counts.notna() & (counts != usual)).astype(bool)


def _style(row, index: int = 0) -> dict:
    """RoPE scalings dashed with squares, sliding windows dotted with triangles; plain lines
    past the 20 colours of tab20 dashed, so no two lines look alike."""
    scaled = row.get("scaling", "none") != "none" or row.get("method", "none") != "none"
    sliding = row["mode"] == "sliding"
    plain = "--" if index >= 20 else "-"
    return {"linestyle": "-." if scaled and sliding else "--" if scaled else ":" if sliding else plain,
            "marker": "^" if sliding else "s" if scaled else "o"}


def _log_axes(ax, x_ticks: list[float], multiples: bool, log_y: bool) -> None:
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log", base=2)
    labels = [f"{t:g}x" if multiples else str(int(t)) for t in x_ticks]
    if not multiples and len(x_ticks) > 8:  # 1 .. 4096 tokens would overlap: every other length
        labels = [lab if i % 2 == 0 else "" for i, lab in enumerate(labels)]
    ax.set_xticks(x_ticks, labels)
    ax.xaxis.set_minor_formatter(NullFormatter())
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        # label the 2s, 3s and 5s between decades, not every minor tick; all of them where the axis
        # spans less than a decade (4 to 7 nats would otherwise show only the 5)
        def minor(v, _):
            low, high = ax.get_ylim()
            return f"{v:g}" if f"{v:e}"[0] in "235" or 0 < low and high / low < 10 else ""

        ax.yaxis.set_minor_formatter(FuncFormatter(minor))
    ax.grid(True, which="both", alpha=0.3)


def _legend(ax, n: int, palette: Palette | None = None) -> None:
    """The legend of ``n`` lines, never over the data: beside the axes past 10 entries, below them
    (two columns) up to 10, where "best" placement would still cover a line that spans the panel;
    ``--by`` values most of its lines share are left out of the entries and named once in the
    title (:meth:`Palette.compact`, from the lines' data: each entry's line is the name its
    ``gid`` carries, 'ours:rope', and what the entry adds to it, ' (L=2048)', stays)."""
    handles, labels = ax.get_legend_handles_labels()
    names = [str(h.get_gid()).split(":", 1)[1] if ":" in str(h.get_gid()) else None for h in handles]
    short, common = palette.compact([n for n in names if n]) if palette is not None else ({}, "")
    labels = [short[name] + label[len(name):] if name in short and label.startswith(name) else label
              for name, label in zip(names, labels)]
    title = {"title": f"unless shown: {common}", "title_fontsize": "small"} if common else {}
    if n > 10:
        ax.legend(handles, labels, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), **title)
    else:
        _below(ax, handles, labels, **title)


def _below(ax, handles=None, labels=None, **kw) -> None:
    """A legend under the axes' x label, in two columns."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, labels, fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=2,
              frameon=False, **kw)


def _height(n: int, few: float, many: float = 5.4) -> float:
    """A figure's height in inches: up to 10 lines, ``few`` plus room for a legend of ``n`` entries
    in two columns below the axes (:func:`_legend`, about 0.2 inch a row at the small font); more,
    tall enough for a legend of ``n`` entries beside the axes."""
    return few + 0.2 * math.ceil(n / 2) + 0.4 if n <= 10 else max(many, 0.2 * n + 1.4)


# ---------------------------------------------------------------- perplexity and its ratio
PANELS = {  # summary columns and gid prefixes of one panel: mean, interval, line, band, hollow markers
    "ppl": ("ppl_mean", "ppl_ci_low", "ppl_ci_high", "ours", "interval", "seeds"),
    "ratio": ("ratio_mean", "ratio_ci_low", "ratio_ci_high", "ratio", "ratio_interval", "ratio_seeds")}


def ratio_interval_label(methods) -> str:
    """What the ratio panel's bands are, from the ``ratio_method`` values drawn."""
    used = [text for method, text in RATIO_METHODS.items() if method in set(methods)]
    return "95% interval of the ratio:\n" + ("\nelse ".join(used) if used else "none")


def _draw_lines(ax, summary: pd.DataFrame, palette: Palette, multiples: bool, panel: str) -> bool:
    """One line per name: ``panel``'s mean over seeds, its 95% interval shaded where the summary
    has one, hollow markers on the cells with an uneven seed count. -> whether any band was drawn."""
    mean, low, high, gid, band, hollow = PANELS[panel]
    summary = summary.assign(name=palette.names(summary), _uneven=uneven_seeds(summary))
    many, shaded = summary.name.nunique() > 10, False
    for i, (name, g) in enumerate(summary.groupby("name", sort=False)):
        g = g.sort_values("eval_len")
        x = (g.eval_len / g.train_len if multiples else g.eval_len).to_numpy(dtype=float)
        y, odd, colour = g[mean].to_numpy(dtype=float), g._uneven.to_numpy(), palette.colour(name)
        style, size = _style(g.iloc[0], i), 4 if many else 6
        ax.plot(x, y, label=name if panel == "ppl" else None, color=colour, markersize=size, gid=f"{gid}:{name}",
                markevery=[int(j) for j in np.flatnonzero(~odd)] if odd.any() else None, **style)
        if odd.any():
            ax.plot(x[odd], y[odd], linestyle="none", marker=style["marker"], markersize=size, color=colour,
                    markerfacecolor="white", gid=f"{hollow}:{name}")
        if low in g and g[low].notna().any():
            shaded = True
            ax.fill_between(x, g[low], g[high], color=colour, alpha=0.2, linewidth=0, gid=f"{band}:{name}")
    return shaded


BAND_SPARE = 0.5  # of the lines' own span (on a log axis, of their log span), kept above and below them
CLIPPED_NOTE = "some intervals run past the axes: the table has them"


def _fit_to_lines(ax, summary: pd.DataFrame, panel: str) -> None:
    """Bands do not set the y axis: it fits ``panel``'s lines with half their span to spare above
    and below. Two seeds that disagree give an interval reaching 1e8 (Student's t at one degree
    of freedom), which would otherwise flatten every line into the bottom of the axes; a band cut
    off so is said under the axes, and the table keeps its numbers. Call it after the axis' scale
    and x label are set."""
    mean, low, high = PANELS[panel][:3]
    y = summary[mean].dropna() if mean in summary else pd.Series(dtype=float)
    if low not in summary or y.empty or summary[low].isna().all():
        return
    log = ax.get_yscale() == "log"
    to, back = (np.log, np.exp) if log else (float, float)
    lo, hi = to(y.min()), to(y.max())
    spare = max(BAND_SPARE * (hi - lo), np.log(1.25) if log else 0.05 * abs(hi))
    now_lo, now_hi = ax.get_ylim()
    fit_lo, fit_hi = max(now_lo, back(lo - spare)), min(now_hi, back(hi + spare))
    if (fit_lo, fit_hi) != (now_lo, now_hi):
        ax.set_ylim(fit_lo, fit_hi)
        ax.set_xlabel(f"{ax.get_xlabel()}\n({CLIPPED_NOTE})")  # under the axes: no legend covers it


def _hollow_entry(ax, summary: pd.DataFrame, gid: str) -> None:
    if uneven_seeds(summary).any():
        ax.plot([], [], linestyle="none", marker="o", color="gray", markerfacecolor="white", label=SEEDS_LABEL, gid=gid)


def _draw_ours(ax, summary: pd.DataFrame, palette: Palette, multiples: bool) -> None:
    """Perplexity: one line per name, mean ppl over seeds, its 95% interval shaded (``ppl_ci_low``
    .. ``ppl_ci_high``, where the summary has one; the legend says which interval), a dashed
    train-length marker."""
    if _draw_lines(ax, summary, palette, multiples, "ppl"):  # one grey legend entry says what every band is
        ax.fill_between([], [], [], color="gray", alpha=0.2, linewidth=0, label=INTERVAL_LABEL, gid="interval")
    _hollow_entry(ax, summary, "seeds")
    for i, tlen in enumerate([1] if multiples else sorted(summary.train_len.unique())):
        ax.axvline(tlen, color="gray", linestyle="--", linewidth=1, gid="train_len",
                   label="train length" if i == 0 else None)


def _draw_ratio(ax, summary: pd.DataFrame, palette: Palette, multiples: bool) -> None:
    """ppl(L) / ppl(train_len) (``ratio_mean``), each line's band the paired 95% interval of that
    ratio (``ratio_ci_low`` .. ``ratio_ci_high``; the legend names the methods drawn), a grey
    line at 1 (as good as at the train length)."""
    if _draw_lines(ax, summary, palette, multiples, "ratio"):
        drawn = summary.loc[summary.ratio_ci_low.notna() & (summary.eval_len != summary.train_len), "ratio_method"]
        ax.fill_between([], [], [], color="gray", alpha=0.2, linewidth=0, label=ratio_interval_label(drawn),
                        gid="ratio_interval")
    _hollow_entry(ax, summary, "ratio_seeds")
    ax.axhline(1, color="black", linewidth=0.8, gid="ratio_one", label="ppl(L) = ppl(train_len)")
    for tlen in [1] if multiples else sorted(summary.train_len.unique()):
        ax.axvline(tlen, color="gray", linestyle="--", linewidth=1, gid="train_len")
    ax.set_ylabel("ppl(L) / ppl(train_len)")
    _below(ax)


def _powers_of_two(hi: float) -> list[float]:
    """1, 2, 4, ... up to the first power of two at or past ``hi`` (4 for 4: the axis ends at the data)."""
    return [2.0 ** k for k in range(0, int(math.ceil(math.log2(max(hi, 1.0)) - 1e-9)) + 1)]


def reference_lines(summary: pd.DataFrame, reference: pd.DataFrame | None,
                    setup: pd.DataFrame | None = None) -> list[str]:
    """Our line names the published panel is drawn beside, empty where it is not drawn.

    The comparison means something only for a line that shares the reference's protocol and
    encoding: non-overlapping windows, no RoPE scaling, an encoding the reference has, evaluated
    past its train length, trained on windows of no fewer than :data:`REFERENCE_MIN_TRAIN_LEN`
    tokens, and only where every run of ``setup`` (one row per run, :func:`budget_short`) trained on
    at least :data:`REFERENCE_MIN_TOKENS` tokens. The corpus, model size and training budget still
    differ; the panel's title says how."""
    if reference is None or summary.empty or budget_short(setup):
        return []
    names = line_names(summary)
    plain = (summary["mode"] == "nonoverlapping") & as_trained(summary) & \
        summary.encoding.isin(set(reference.dropna(subset=["ppl"]).encoding)) & \
        (summary.train_len >= REFERENCE_MIN_TRAIN_LEN) & summary.ppl_mean.notna()
    past = summary.eval_len > summary.train_len
    return list(dict.fromkeys(names[plain & past]))


def budget_short(setup: pd.DataFrame | None) -> str:
    """Why the runs of ``setup`` (one row per run with ``train_tokens``) are too briefly trained for
    the published panel, '' where they are not: the fewest training tokens of a run, or 'unknown'."""
    tokens = setup["train_tokens"] if setup is not None and "train_tokens" in setup else pd.Series(dtype=float)
    tokens = pd.to_numeric(tokens, errors="coerce")
    if tokens.empty or tokens.isna().any():
        return "training tokens unknown (a run without its config.yaml)"
    least = float(tokens.min())
    return "" if least >= REFERENCE_MIN_TOKENS else f"the least trained run saw {amount(least)} tokens"


def _reference_title(reference: pd.DataFrame, ours: pd.DataFrame) -> str:
    """The published source, then what differs from ours: corpus, train_len, model size, tokens."""
    source = str(reference.source.dropna().iloc[0]) if "source" in reference and reference.source.notna().any() \
        else "published"

    def side(who: str, frame: pd.DataFrame) -> str:
        caption = setup_caption(frame.drop(columns=[c for c in ("model", "steps") if c in frame]))
        text = (f"{who}: train_len {'/'.join(map(str, sorted(frame.train_len.unique())))}"
                + (f", {caption}" if caption else ""))
        return textwrap.fill(text, 60, subsequent_indent="    ")

    return "\n".join([textwrap.fill(source, 60), side("published", reference), side("ours", ours)])


def _draw_reference(ax, reference: pd.DataFrame, summary: pd.DataFrame, matched: list[str], palette: Palette,
                    ours_setup: pd.DataFrame) -> float:
    """The published numbers, each encoding in the colour of our matching line. -> the largest multiple."""
    names, drawn = line_names(summary), palette.names(summary)  # the same, unless the palette is another report's
    colour_of = {}
    for name in matched:
        colour_of.setdefault(summary.encoding[names == name].iloc[0], palette.colour(drawn[names == name].iloc[0]))
    ref = reference.dropna(subset=["ppl"])
    for enc, g in ref.groupby("encoding", sort=False):
        g = g.sort_values("eval_len")
        ax.plot(g.eval_len / g.train_len, g.ppl, marker="o", label=enc, gid=f"paper:{enc}",
                color=colour_of.get(enc) or palette.colour(f"paper:{enc}"))
    ax.axvline(1, color="gray", linestyle="--", linewidth=1, gid="train_len", label="train length")
    ax.set_title(_reference_title(reference, ours_setup), fontsize="small")
    ax.set_ylabel("perplexity (published)")
    _legend(ax, ref.encoding.nunique(), palette)
    return float((ref.eval_len / ref.train_len).max())


def ppl_figure(summary: pd.DataFrame, reference: pd.DataFrame | None = None, log_y: bool = True,
               palette: Palette | None = None, setup: pd.DataFrame | None = None):
    """Perplexity vs evaluation length; beside it the ratio ppl(L) / ppl(train_len), which is what
    extrapolation is about (a few percent of drift shows there even when each perplexity's own
    interval, the spread of the validation text, is far wider); and, with ``reference`` where
    :func:`reference_lines` finds a line to compare, a third panel with those published numbers
    (x shared). ``palette``: the report's colours (default: from ``summary``); ``setup``: one
    row per run (model, params, data, steps, train_tokens) for the caption.

    x is the evaluation length as a multiple of the train length, on a log2 scale. The
    question is how far past its training length a model holds up, and the paper trained at
    512 tokens where posbench's quick runs train at 64 or 128: in multiples, every panel puts
    the train length at 1x and the same extrapolation factor at the same place, so their
    shapes compare at a glance (the absolute lengths are in the table and the panel titles).
    y is logarithmic by default (``log_y``): one line that blows up by orders of magnitude
    (sinusoidal past 2x) would squash the others into a flat band on a linear axis, and equal
    ratios stay equal steps; the ratio panel turns logarithmic only where its lines span more
    than 2x, so a few percent of drift still shows as a slope. ``posbench report --linear-y``
    draws both linear."""
    plt = _pyplot()
    palette = palette or Palette(summary)
    setup = _summary_setup(summary) if setup is None else setup
    matched = reference_lines(summary, reference, setup)
    names = list(dict.fromkeys(palette.names(summary)))
    many = len(names) > 10
    panels = 3 if matched else 2
    fig, axes = plt.subplots(1, panels, figsize=((9.0 if many else 6.0) + 5.4 * (panels - 1), _height(len(names), 4.8)),
                             layout="constrained", squeeze=False)
    ours, ratio = axes[0, 0], axes[0, 1]
    ratio.sharex(ours)
    _draw_ours(ours, summary, palette, multiples=True)
    _draw_ratio(ratio, summary, palette, multiples=True)
    top = float((summary.eval_len / summary.train_len).max())
    tlens = ", ".join(map(str, sorted(summary.train_len.unique())))
    ours.set_title(f"posbench (train_len={tlens})")
    ratio.set_title("perplexity relative to the train length")
    ours.set_ylabel("perplexity")
    _legend(ours, len(names), palette)
    tops = {ours: top, ratio: top}
    if matched:  # its own x: the paper's 30x would squash ours (16x at most) into half the width
        tops[axes[0, 2]] = _draw_reference(axes[0, 2], reference, summary, matched, palette, setup)
    ratios = summary.ratio_mean.dropna() if "ratio_mean" in summary else pd.Series(dtype=float)
    wide = not ratios.empty and ratios.max() / max(ratios.min(), 1e-9) > 2  # a few % would get no log-scale ticks
    for ax, hi in tops.items():
        _log_axes(ax, _powers_of_two(hi), multiples=True, log_y=log_y and (ax is not ratio or wide))
        ax.set_xlabel("evaluation length / train length")
    _fit_to_lines(ours, summary, "ppl")
    _fit_to_lines(ratio, summary, "ratio")
    _caption(fig, setup)
    return fig


def run_figure(summary: pd.DataFrame, title: str | None = None, setup: pd.DataFrame | None = None):
    """One run (or any summary) in absolute tokens: perplexity and ppl(L) / ppl(train_len) vs
    evaluation length, log2 x, dashed line at the train length; ``setup`` for the caption."""
    plt = _pyplot()
    palette = Palette(summary)
    names = list(dict.fromkeys(palette.names(summary)))
    many = len(names) > 10
    fig, (ax, ratio) = plt.subplots(1, 2, figsize=(14.0 if many else 11.0, _height(len(names), 4.4)),
                                    layout="constrained")
    _draw_ours(ax, summary, palette, multiples=False)
    _draw_ratio(ratio, summary, palette, multiples=False)
    for a in (ax, ratio):
        _log_axes(a, sorted(summary.eval_len.unique()), multiples=False, log_y=False)
        a.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity")
    tlens = ", ".join(map(str, sorted(summary.train_len.unique())))
    ax.set_title(title or f"perplexity vs length (train_len={tlens})")
    ratio.set_title("perplexity relative to the train length")
    _legend(ax, len(names), palette)
    _caption(fig, _summary_setup(summary) if setup is None else setup)
    return fig


# ---------------------------------------------------------------- loss by position, training curves
def _position_bins(g: pd.DataFrame) -> pd.DataFrame:
    """One line's positions rows at one window -> per bin: the token-weighted NLL (``weighted`` /
    ``weight``), ``windows`` per seed and ``fed`` (at least :data:`MIN_BIN_WINDOWS` windows and
    :data:`MIN_BIN_TOKENS` tokens per seed)."""
    weight = g.tokens if "tokens" in g else pd.Series(float(MIN_BIN_TOKENS), index=g.index)
    g = g.assign(weighted=g.nll * weight, weight=weight)
    bins = g.groupby(["bin_start", "bin_end"])[["weighted", "weight"]].sum().reset_index()
    per_seed = bins.weight / (g.seed.nunique() if "seed" in g else 1)
    windows = per_seed / (bins.bin_end - bins.bin_start + 1)
    fed = (per_seed >= MIN_BIN_TOKENS) & (windows >= MIN_BIN_WINDOWS) if "tokens" in g else per_seed > 0
    return bins.assign(windows=windows, fed=fed)


def positions_windows(positions: pd.DataFrame) -> float:
    """The most windows per seed that feed any bin of any line at any window with at least
    :data:`MIN_BIN_TOKENS` tokens: below :data:`MIN_BIN_WINDOWS`, :func:`positions_figure` would
    draw nothing, and the report draws no figure (and says why)."""
    if positions.empty or "tokens" not in positions:
        return math.inf if not positions.empty else 0.0
    keys = [c for c in ("label", *LINE[1:], "eval_len") if c in positions]
    best = 0.0
    for _, g in positions.groupby(keys, dropna=False, sort=False):
        bins = _position_bins(g)
        per_seed = bins.weight / (g.seed.nunique() if "seed" in g else 1)
        found = bins.windows[per_seed >= MIN_BIN_TOKENS]
        best = max(best, float(found.max()) if len(found) else 0.0)
    return best


def positions_figure(positions: pd.DataFrame, log_y: bool = True, palette: Palette | None = None,
                     setup: pd.DataFrame | None = None, without: list[str] = ()):
    """Mean NLL (over seeds, weighted by tokens) vs position in the window, one line per
    label, each at its own longest evaluated window that feeds a bin (its L in the legend). x is the 1-based
    position of the predicted token (bin midpoints), log2 scale, so the first positions, where
    the loss falls fastest, get room; the dashed line marks the train length, past which the
    model never saw a position in training. Bins fed (per seed) by fewer than
    :data:`MIN_BIN_WINDOWS` windows or :data:`MIN_BIN_TOKENS` tokens are left out (see the
    constants: fewer windows draw the text, not the positions); the report draws no figure where
    no bin is fed (:func:`positions_windows`). ``without``: the report's lines that have no
    positions rows (runs scored before positions.csv existed), named in the caption so that a
    reader does not take the figure for every line."""
    plt = _pyplot()
    palette = palette or Palette(positions)
    positions = positions.assign(name=palette.names(positions))
    names = list(dict.fromkeys(positions.name))
    longest = int(positions.eval_len.max())
    fig, ax = plt.subplots(figsize=(9.0 if len(names) > 10 else 6.4, _height(len(names), 4.4, 5.2)),
                           layout="constrained")
    left_out = 0
    drawn = 0
    for name, line in positions.groupby("name", sort=False):
        for length in sorted(line.eval_len.unique(), reverse=True):  # the longest window with a fed bin
            g = line[line.eval_len == length]
            bins = _position_bins(g)
            if bins.fed.any():
                break
        left_out += int((~bins.fed).sum())
        bins = bins[bins.fed]
        drawn += len(bins)
        ax.plot((bins.bin_start + bins.bin_end) / 2 + 1, bins.weighted / bins.weight, marker=".",
                color=palette.colour(name), gid=f"positions:{name}", linestyle=_style(g.iloc[0])["linestyle"],
                label=f"{name} (L={int(g.eval_len.iloc[0])})")
    for i, tlen in enumerate(sorted(positions.train_len.unique())):
        ax.axvline(tlen, color="gray", linestyle="--", linewidth=1, gid="train_len",
                   label="train length" if i == 0 else None)
    _log_axes(ax, _powers_of_two(longest), multiples=False, log_y=log_y and drawn > 0)
    ax.set_xlabel("position in the window (tokens, 1 = first predicted token)")
    ax.set_ylabel("mean NLL (nats)")
    ax.set_title("loss by position, each line at its longest window L fed enough windows", fontsize="medium")
    _legend(ax, len(names), palette)
    note = (f"{left_out} bin(s) fed by < {MIN_BIN_WINDOWS} windows or < {MIN_BIN_TOKENS} tokens per seed left out"
            if left_out else "")
    _caption(fig, setup, note, missing_positions(without))
    return fig


def missing_positions(without: list[str]) -> str:
    """'not drawn (no positions.csv): a, b', or '' where every line has positions rows."""
    return f"not drawn (no positions.csv): {', '.join(without)}" if len(without) else ""


def training_figure(curves: pd.DataFrame, palette: Palette | None = None, setup: pd.DataFrame | None = None):
    """Training loss vs training tokens, one line per ``name``: the mean over its runs (seeds) at
    each logged step, the band their min .. max. ``curves``: one row per run and logged step with
    ``name``, ``run``, ``step``, ``tokens`` (step x batch_size x train_len; NaN where a run's
    config is missing, and then x is the step) and ``loss`` (the mean over the logging window)."""
    from matplotlib.ticker import EngFormatter

    plt = _pyplot()
    palette = palette or Palette(extra=list(dict.fromkeys(curves.name)))
    names = list(dict.fromkeys(curves.name))
    by_tokens = curves.tokens.notna().all()
    fig, ax = plt.subplots(figsize=(9.0 if len(names) > 10 else 6.4, _height(len(names), 4.4, 5.2)),
                           layout="constrained")
    banded = False
    for name, g in curves.groupby("name", sort=False):
        at = g.groupby("step").agg(x=("tokens" if by_tokens else "step", "mean"), mean=("loss", "mean"),
                                   low=("loss", "min"), high=("loss", "max"), runs=("run", "nunique"))
        colour = palette.colour(name)
        seeds = g.run.nunique()
        ax.plot(at.x, at["mean"], color=colour, label=f"{name} ({seeds} seed{'' if seeds == 1 else 's'})",
                gid=f"training:{name}")
        if (at.runs > 1).any():
            banded = True
            ax.fill_between(at.x, at.low, at.high, color=colour, alpha=0.2, linewidth=0, gid=f"training_band:{name}")
    if banded:
        ax.fill_between([], [], [], color="gray", alpha=0.2, linewidth=0, label="min .. max over seeds")
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.set_xlabel("training tokens" if by_tokens else "step")
    ax.set_ylabel("training loss (nats, mean over each logging window)")
    ax.set_title("training loss (mean over seeds)", fontsize="medium")
    ax.grid(True, alpha=0.3)
    _legend(ax, len(names), palette)
    _caption(fig, setup)
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


def tasks_figure(summary: pd.DataFrame, setup: pd.DataFrame | None = None):
    """Accuracy (%) vs eval size as a multiple of the train size (log2 x), one panel per task:
    exact match in the upper panels, per-token accuracy in the lower ones (beyond the training
    size exact match is often 0 for every line, and token accuracy still tells them apart). One
    line per label (:mod:`posbench.report.tasks`) with its 95% interval shaded. A label has one
    colour in every panel; lines trained on randomized positions are dashed with squares; the
    dashed grey line marks the train size (1x). One legend for all panels; ``setup`` (one row per
    run: model, params, steps) captions it."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    plt = _pyplot()
    tasks, names = list(dict.fromkeys(summary.task)), list(dict.fromkeys(summary.label))
    palette = Palette(extra=names)
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
                handles[name], = ax.plot(h.multiple, 100 * h[column], color=palette.colour(name), label=name,
                                         linestyle="--" if rand else "-", marker="s" if rand else "o", markersize=5,
                                         gid=f"{gid}:{task}:{name}")
                if h[f"{prefix}_lo"].notna().any():
                    ax.fill_between(h.multiple, 100 * h[f"{prefix}_lo"], 100 * h[f"{prefix}_hi"],
                                    color=palette.colour(name), alpha=0.15, linewidth=0,
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
    _caption(fig, setup)
    return fig
