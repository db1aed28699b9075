"""Does a model use context past its training length? The same tokens with and without it.

Perplexity at L > train_len mixes two things: whether the model still works on positions it never
saw, and whether it gets anything out of the tokens further back. Sliding windows
(``eval.mode=sliding``, Press et al. 2022, app. B) give every token scored L - S tokens of context
or more; KERPLE's control (Chi et al. 2022, sec. 4.3) asks what that context is worth token by
token. Here every token is scored twice by the same run:

* **short**: in the nonoverlapping windows of the run's train_len T, where token t (0-based in the
  scored tokens) sees the ``t mod T`` tokens before it in its window, and
* **long**: in a sliding window of L > T tokens (stride S), where it sees L - S tokens or more,

and the **gain** is NLL(short) - NLL(long), in nats, averaged over tokens, by the token's offset
``t mod T`` in its short window. Only tokens t >= L count: the first long window scores its
tokens with no more context than they have in short windows. Both rows score the same tokens
(every length of a ladder does, :mod:`posbench.eval.ladder`), so the difference is paired.

Read it by offset: near offset 0 a short window gives a token almost nothing, so a gain there is
what any context does; near offset T - 1 the token already has T tokens of context in both, so a
gain there is what the tokens *past* train_len add. A gain > 0 says the longer window helps; < 0
that the longer window hurts (positions the model cannot read). The median State of the Union
address is about 6,400 words, so on posbench's default corpus a long window may span the end of
one speech and the start of the next: context that exists but is worth less.

Intervals: per line (runs that differ only in seed), the mean gain over seeds with a 95% interval
covering the seeds' spread and the text's (a block bootstrap of the per-token differences,
:class:`posbench.intervals.Estimator`), centred on the estimate.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..eval.results import line_names, with_labels
from ..eval.token_nll import FILE as TOKEN_NLL
from ..eval.token_nll import read_token_nll, row_key
from ..intervals import BLOCKS, Cell, Estimator, block_sums

BINS = 4  # offset bins of the short window
COLUMNS = ["line", "context", "offsets", "offset_lo", "offset_hi", "tokens", "seeds", "gain", "low", "high", "method"]


def offset_edges(short: int, bins: int = BINS) -> np.ndarray:
    """Bin edges over offsets 0 .. short - 1: ``bins`` equal bins (fewer where short is smaller)."""
    return np.unique(np.round(np.linspace(0, short, min(bins, short) + 1)).astype(np.int64))


def pair_sums(short_nll: np.ndarray, long_nll: np.ndarray, short: int, long: int, lo: int, hi: int,
              blocks: int = BLOCKS) -> tuple[float, np.ndarray, np.ndarray]:
    """One run: (mean gain, per-block gain sums, per-block token counts) over the tokens t >= long
    with lo <= t mod short < hi; the blocks are :func:`posbench.intervals.block_sums`' blocks of
    all n scored tokens, so every run of a line shares them."""
    t = np.arange(short_nll.size)
    keep = (t >= long) & (t % short >= lo) & (t % short < hi)
    diff = np.where(keep, short_nll.astype(np.float64) - long_nll.astype(np.float64), 0.0)
    sums, _ = block_sums(diff, blocks)
    counts = block_sums(keep, blocks)[0].astype(np.int64)  # the kept tokens of each block
    total = counts.sum()
    return (float(sums.sum() / total) if total else math.nan), sums, counts


def _pairs(df: pd.DataFrame, names=line_names) -> pd.DataFrame:
    """Each run's (short row, long row) pairs: its nonoverlapping row at train_len and each sliding
    row at a longer length, same split and scaling; ``line``: the short row's line name."""
    ok = with_labels(df[df.status == "ok"])
    ok = ok.assign(line=names(ok))
    short = ok[(ok["mode"] == "nonoverlapping") & (ok.eval_len == ok.train_len)]
    long = ok[(ok["mode"] == "sliding") & (ok.eval_len > ok.train_len)]
    keys = ["run", "split", "rope_scaling"]
    return short.merge(long, on=keys, suffixes=("", "_long"))


def context_gain(df: pd.DataFrame, bins: int = BINS, names=line_names) -> pd.DataFrame:
    """Results rows (with their ``run`` dirs, :func:`posbench.report.collect.collect`) -> one row per
    line, long window and offset bin (and ``all`` offsets): the gain with its interval (COLUMNS).
    Empty where no run has both rows and their per-token NLL. ``names``: rows -> line names (the
    report's palette, so lines are named as in its other figures)."""
    if df.empty or "mode" not in df:
        return pd.DataFrame(columns=COLUMNS)
    pairs = _pairs(df, names)
    estimator, out, arrays = Estimator(), [], {}
    group = ["line", "model", "data", "train_len", "split", "eval_len_long", "stride_long"]
    for (line, _, _, short, _, long, stride), runs in pairs.groupby(group, sort=True):
        found = []
        for r in runs.itertuples():
            nll = arrays.setdefault(r.run, read_token_nll(Path(r.run) / TOKEN_NLL))
            a, b = nll.get(row_key(r._asdict())), nll.get(row_key({**r._asdict(), **_long_fields(r)}))
            if a is not None and b is not None:
                found.append((int(r.seed), a, b))
        if not found:
            continue
        # tokens 1 .. n in order at every length, n set by the lengths one command evaluated: the
        # arrays of two commands share their first min(n) tokens
        m = min(min(a.size, b.size) for _, a, b in found)
        found = [(seed, a[:m], b[:m]) for seed, a, b in found]
        edges = offset_edges(int(short), bins)
        spans = [(int(lo), int(hi)) for lo, hi in zip(edges[:-1], edges[1:])] + [(0, int(short))]
        for lo, hi in spans:
            per = [pair_sums(a, b, int(short), int(long), lo, hi) for _, a, b in found]
            counts = per[0][2]
            if not counts.sum():
                continue
            cell = Cell(np.array([s for s, _, _ in found]), np.array([m for m, _, _ in per]),
                        np.stack([s for _, s, _ in per]), counts.astype(np.float64))
            iv = estimator.cell(cell)
            out.append({"line": line, "context": f"sliding {int(long)}/{int(stride)}",
                        "offsets": "all" if (lo, hi) == (0, int(short)) else f"{lo}-{hi - 1}",
                        "offset_lo": lo, "offset_hi": hi - 1, "tokens": int(counts.sum()), "seeds": len(found),
                        "gain": iv.estimate, "low": iv.low, "high": iv.high, "method": iv.method})
    return pd.DataFrame(out, columns=COLUMNS)


def _long_fields(r) -> dict:
    return {"mode": r.mode_long, "stride": r.stride_long, "eval_len": r.eval_len_long}


def _cell(row) -> str:
    if math.isnan(row.low):
        return f"{row.gain:+.3f}"
    return f"{row.gain:+.3f} [{row.low:+.3f}, {row.high:+.3f}]"


def context_markdown(gain: pd.DataFrame) -> str:
    """report.md's context section: a table of lines x offset bins, and what the numbers mean."""
    if gain.empty:
        return ""
    order = list(dict.fromkeys(gain.offsets))
    table = gain.assign(cell=[_cell(r) for r in gain.itertuples()]).pivot_table(
        index=["line", "context"], columns="offsets", values="cell", aggfunc="first", sort=False)[order]
    head = "| line | longer window | " + " | ".join(f"offsets {o}" for o in order) + " |"
    lines = [head, "|" + "---|" * (len(order) + 2)]
    lines += [f"| {line} | {ctx} | " + " | ".join(str(v) for v in row) + " |" for (line, ctx), row in table.iterrows()]
    return ("\n## Context\n\nWhat a longer window adds, token by token (KERPLE's control): each token's NLL in the "
            "run's nonoverlapping train_len windows minus its NLL in the sliding window, in nats, by the token's "
            "offset in its short window (how much context the short window gave it), over the tokens past the "
            "first long window; > 0: the longer window helps. Mean over seeds, 95% interval over seeds and text. "
            "The median State of the Union address is about 6,400 words, so on the default corpus a long window "
            "can span two speeches.\n\n" + "\n".join(lines) + "\n")


def context_figure(gain: pd.DataFrame, palette=None, setup=None):
    """Gain by offset bin, one line per (model line, longer window), with its interval."""
    import matplotlib.pyplot as plt

    from .figures import _caption

    bins = gain[gain.offsets != "all"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (line, ctx), rows in bins.groupby(["line", "context"], sort=False):
        x = (rows.offset_lo + rows.offset_hi) / 2
        color = palette.colour(line) if palette is not None else None
        ax.plot(x, rows.gain, marker="o", label=f"{line}, {ctx}", color=color)
        if rows.low.notna().all():
            ax.fill_between(x, rows.low, rows.high, alpha=0.2, color=ax.lines[-1].get_color())
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("offset in the train_len window (tokens of context it gives)")
    ax.set_ylabel("NLL(short) - NLL(long window), nats")
    ax.set_title("What the longer window adds, by offset (> 0: it helps)")
    ax.legend(fontsize="small")
    _caption(fig, setup)
    fig.tight_layout()
    return fig
