"""LongPPL in the report: where ``posbench longppl`` wrote a longppl.csv under the reported paths
(:mod:`posbench.eval.longppl`; a study keeps it beside its runs), report.md gets a LongPPL section
and the report folder longppl.csv (the summary) and longppl.png/.svg.

Per line (as results rows name it: encoding, scaling, protocol, and the model where several are
reported) and length: LongPPL and the perplexity over the same tokens, each the geometric mean over
the seeds, with the key and scored token counts and the evaluator that chose the key tokens. Then
the pairs of lines whose order at a length differs between LongPPL and perplexity: what Fang et al.
(ICLR 2025) show perplexity misses. These are orders of point estimates: longppl.csv keeps no
per-block sums, so no interval backs them, and the section says so rather than calling them verdicts.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd

from ..eval.longppl import FILE
from ..eval.results import find_files, line_label
from ..runs.rundir import atomic_write_text

SUMMARY = "longppl.csv"  # in the report folder: the summary below, not the rows ``posbench longppl`` wrote


def read_longppl(paths: list[str | Path], out: Path) -> pd.DataFrame:
    """Every longppl.csv under ``paths`` (not the report folder's own summary), one frame."""
    own = (Path(out) / SUMMARY).resolve()
    found = [p for p in find_files(paths, FILE) if p.resolve() != own]
    return pd.concat([pd.read_csv(p) for p in found], ignore_index=True) if found else pd.DataFrame()


def longppl_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """(line, eval_len) -> LongPPL and ppl over the same tokens (geometric means over seeds)."""
    several = rows.model.nunique() > 1
    line = [line_label(r.encoding, r.rope_scaling, r["mode"], r.stride) + (f" ({r.model})" if several else "")
            for _, r in rows.iterrows()]
    rows = rows.assign(line=line, log_longppl=np.log(rows.longppl), log_ppl=np.log(rows.ppl))
    summary = rows.groupby(["line", "eval_len"], sort=False).agg(
        longppl=("log_longppl", "mean"), ppl=("log_ppl", "mean"), seeds=("seed", "nunique"),
        key_tokens=("key_tokens", "first"), tokens=("tokens", "first"), evaluator=("evaluator", "first"),
        long_len=("long_len", "first"), short_len=("short_len", "first"), short_stride=("short_stride", "first"))
    summary[["longppl", "ppl"]] = np.exp(summary[["longppl", "ppl"]])
    return summary.reset_index().sort_values(["eval_len", "longppl"], ignore_index=True)


def order_changes(summary: pd.DataFrame) -> list[str]:
    """Each length's pairs of lines that LongPPL and perplexity order oppositely. Lines with the
    same two values at a length (a method that leaves the model as trained there reuses its rows)
    are one entry, named ``a = b``, so one fact is said once. Each entry gives how far apart the
    two LongPPLs are in nats summed over the key tokens, k |ln(LongPPL_a / LongPPL_b)| (k key
    tokens): below 1, less than one key token's NLL moving by one nat, which on a few dozen key
    tokens is no finding."""
    found = []
    summary = summary if "key_tokens" in summary else summary.assign(key_tokens=np.nan)
    for length, g in summary.groupby("eval_len"):
        g = g.groupby(["ppl", "longppl"], sort=False, as_index=False).agg(
            line=("line", " = ".join), key_tokens=("key_tokens", "first"))
        for a, b in itertools.combinations(g.itertuples(), 2):
            if (a.ppl - b.ppl) * (a.longppl - b.longppl) < 0:
                lo, hi = (a, b) if a.ppl < b.ppl else (b, a)
                nats = "" if np.isnan(a.key_tokens) else \
                    f"; {a.key_tokens * abs(np.log(a.longppl / b.longppl)):.1f} nats apart over the key tokens"
                found.append(f"at {length}: {lo.line} < {hi.line} by perplexity ({lo.ppl:.2f} < {hi.ppl:.2f}), "
                             f"{hi.line} < {lo.line} by LongPPL ({hi.longppl:.2f} < {lo.longppl:.2f}{nats})")
    return found


def longppl_markdown(summary: pd.DataFrame) -> str:
    first = summary.iloc[0]
    rows = "".join(f"| {r.line} | {r.eval_len} | {r.longppl:.2f} | {r.ppl:.2f} | {r.key_tokens:,} of {r.tokens:,} "
                   f"| {r.seeds} |\n" for r in summary.itertuples())
    changes = order_changes(summary)
    said = ("".join(f"- {c}\n" for c in changes) if changes else
            "- LongPPL orders the lines at every length as perplexity does.\n")
    return ("\n## LongPPL\n\nPerplexity over the key tokens only (Fang et al., ICLR 2025: the tokens the evaluator "
            f"predicts more than 2 nats better with a long context): evaluator `{first.evaluator}`, long context "
            f"{first.long_len:,}, short {first.short_len:,} (stride {first.short_stride:,}). Geometric means over "
            "the seeds; `ppl` is over the same scored tokens. No interval: these compare point estimates.\n\n"
            "| line | eval_len | LongPPL | ppl | key tokens | seeds |\n|---|---|---|---|---|---|\n" + rows
            + "\nWhere LongPPL orders two lines oppositely to perplexity (point estimates; with k key tokens, one "
            "key token's NLL moving by one nat moves LongPPL by a factor e^(1/k)"
            + (f", {np.exp(1 / first.key_tokens):.3f} for these {first.key_tokens:,}" if first.key_tokens else "")
            + ": a pair less than a nat apart over the key tokens is within that):\n\n" + said)


def longppl_figure(summary: pd.DataFrame):
    """LongPPL (left) and perplexity over the same tokens (right) against length, one line each.
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
    from .figures import save

    rows = read_longppl(paths, out)
    if rows.empty:
        return "", []
    if not (rows.key_tokens > 0).any():  # LongPPL is the mean over no tokens: say so, draw nothing
        first = rows.iloc[0]
        return ("\n## LongPPL\n\nNo key tokens: the evaluator `{}` (long context {:,}, short {:,}, stride {:,}) "
                "predicts no scored token more than {} nats better with the long context, with at least {} "
                "log-probability, so LongPPL is not defined for these rows.\n").format(
                    first.evaluator, first.long_len, first.short_len, first.short_stride, first.alpha,
                    first.beta), []
    summary = longppl_summary(rows[rows.key_tokens > 0])
    atomic_write_text(out / SUMMARY, summary.to_csv(index=False))
    files = [out / SUMMARY] + save(longppl_figure(summary), out / "longppl.png", also_svg=True)
    return longppl_markdown(summary), files
