"""Many run dirs -> one tidy table (mean and spread over seeds) -> Markdown, CSV and a figure.

Rows evaluated under a RoPE scaling (``rope_scaling`` column) are their own line, labelled
``<encoding>+<scaling>`` (e.g. ``rope+yarn``); unscaled rows keep the encoding's name.
results.csv files written before the scaling columns existed read as ``none``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from .checkpoint import atomic_write, atomic_write_text
from .errors import PosbenchError

GROUP = ["encoding", "rope_scaling", "model", "data", "train_len", "split", "eval_len"]


def read_results(path: str | Path) -> pd.DataFrame:
    """One results.csv; rows from before RoPE scaling get rope_scaling 'none', rope_factor 1."""
    df = pd.read_csv(path)
    if "rope_scaling" not in df:
        df.insert(df.columns.get_loc("encoding") + 1, "rope_scaling", "none")
    if "rope_factor" not in df:
        df["rope_factor"] = 1.0
    return df.fillna({"rope_scaling": "none", "rope_factor": 1.0})


def _scaling_order(col: pd.Series) -> pd.Series:
    return ("1" + col).where(col != "none", "0") if col.name == "rope_scaling" else col  # none first


def sort_rows(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Sorted by ``by``, unscaled rows before the scalings of the same encoding."""
    return df.sort_values(by, key=_scaling_order).reset_index(drop=True)


def line_label(encoding: str, rope_scaling: str = "none") -> str:
    """'rope' for plain runs, 'rope+yarn' under a scaling."""
    return encoding if pd.isna(rope_scaling) or rope_scaling == "none" else f"{encoding}+{rope_scaling}"


def _with_labels(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with rope_scaling ('none' where absent) and each row's line ``label``."""
    if "rope_scaling" not in df:
        df = df.assign(rope_scaling="none")
    labels = [line_label(e, s) for e, s in zip(df.encoding, df.rope_scaling)]
    return df.assign(label=pd.Series(labels, index=df.index, dtype=object))


def collect(paths: list[str | Path]) -> pd.DataFrame:
    """Every results.csv under ``paths`` (run dirs or sweep dirs), concatenated."""
    files: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise PosbenchError(f"report: {str(p)!r} does not exist")
        files += [p] if p.is_file() else sorted(p.rglob("results.csv"))
    if not files:
        raise PosbenchError(f"report: no results.csv under {', '.join(map(str, paths))}; "
                            "pass run or sweep directories made by posbench train")
    frames = []
    for f in files:
        df = read_results(f)
        df["run"] = str(f.parent)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Mean, std, min, max of ppl over seeds, one row per (encoding, rope_scaling, ..., eval_len),
    with the line's ``label``."""
    df = _with_labels(df)
    ok = df.assign(ppl=df.ppl.where(df.status == "ok"))
    out = ok.groupby(GROUP, dropna=False).ppl.agg(["mean", "std", "min", "max", "count"]).reset_index()
    seeds = df.groupby(GROUP, dropna=False).seed.nunique().reset_index(name="seeds")
    out = out.merge(seeds, on=GROUP).rename(columns={"mean": "ppl_mean", "std": "ppl_std", "min": "ppl_min",
                                                     "max": "ppl_max", "count": "n_ok"})
    out = _with_labels(out)
    return sort_rows(out[["label"] + [c for c in out if c != "label"]], GROUP)


def _fmt(mean: float, std: float) -> str:
    if mean is None or math.isnan(mean):
        return "n/a"
    return f"{mean:.2f}" if std is None or math.isnan(std) else f"{mean:.2f} ± {std:.2f}"


def markdown_table(summary: pd.DataFrame) -> str:
    """Encodings (one row per scaling: 'rope+yarn') as rows, eval lengths as columns,
    'mean ± std' cells."""
    summary = _with_labels(summary)
    lengths = sorted(summary.eval_len.unique())
    header = "| encoding | train_len | seeds | " + " | ".join(f"L={n}" for n in lengths) + " |"
    lines = [header, "|" + "---|" * (3 + len(lengths))]
    for (enc, tlen), g in summary.groupby(["label", "train_len"], sort=False):
        cells = {row.eval_len: _fmt(row.ppl_mean, row.ppl_std) for row in g.itertuples()}
        lines.append(f"| {enc} | {tlen} | {int(g.seeds.max())} | " + " | ".join(cells.get(n, "") for n in lengths) + " |")
    return "\n".join(lines)


def markdown_results(rows: pd.DataFrame) -> str:
    """One run's rows as a Markdown table."""
    lines = ["| encoding | train_len | eval_len | ppl | nll | tokens | status |", "|---|---|---|---|---|---|---|"]
    for r in _with_labels(rows).itertuples():
        status = r.status if len(r.status) < 60 else r.status[:57] + "..."
        lines.append(f"| {r.label} | {r.train_len} | {r.eval_len} | {r.ppl:.2f} | {r.nll:.4f} | {r.tokens} | {status} |")
    return "\n".join(lines)


def spread_summary(summary: pd.DataFrame) -> str:
    """How far apart the encodings are at train_len, and how each (and each scaling) degrades
    at the longest length."""
    summary = _with_labels(summary)
    lines = []
    for tlen, g in summary.groupby("train_len"):
        at_train = g[g.eval_len == tlen].dropna(subset=["ppl_mean"])
        if len(at_train) > 1:
            lo, hi = at_train.ppl_mean.min(), at_train.ppl_mean.max()
            what = "encodings" if (at_train.rope_scaling == "none").all() else "lines"
            lines.append(f"train_len={tlen}: ppl at train_len spans {lo:.2f} .. {hi:.2f} "
                         f"across {len(at_train)} {what} (spread {100 * (hi / lo - 1):.1f}%)")
        for enc, e in g.groupby("label", sort=False):
            base = e[e.eval_len == tlen].ppl_mean
            longest = e[e.eval_len == e.eval_len.max()]
            if len(base) and longest.ppl_mean.notna().all() and not math.isnan(base.iloc[0]):
                lines.append(f"  {enc}: ppl(L={int(longest.eval_len.iloc[0])}) / ppl(L={tlen}) = "
                             f"{longest.ppl_mean.iloc[0] / base.iloc[0]:.2f}")
    return "\n".join(lines)


def plot_ppl_vs_length(df: pd.DataFrame, path: Path, title: str | None = None) -> None:
    """Perplexity vs eval length, log-scale x, one line per encoding and scaling (shaded
    min..max over seeds), dashed vertical line at the train length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = df if "ppl_mean" in df else summarize(df)
    summary = _with_labels(summary)
    groups = list(summary.groupby("label", sort=False))
    many = len(groups) > 10  # a zoo: distinct colours from tab20, legend beside the axes
    fig, ax = plt.subplots(figsize=(9.0, 5.2) if many else (6.4, 4.2))
    colours = plt.get_cmap("tab20").colors if many else plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (enc, g) in enumerate(groups):
        g = g.sort_values("eval_len")
        scaled = (g.rope_scaling != "none").any()  # RoPE scalings dashed, plain encodings solid
        line, = ax.plot(g.eval_len, g.ppl_mean, marker="s" if scaled else "o", label=enc,
                        linestyle="--" if scaled or (many and i >= len(colours)) else "-",
                        color=colours[i % len(colours)], markersize=4 if many else 6)
        if (g.ppl_max > g.ppl_min).any():
            ax.fill_between(g.eval_len, g.ppl_min, g.ppl_max, color=line.get_color(), alpha=0.2)
    for tlen in sorted(summary.train_len.unique()):
        ax.axvline(tlen, color="gray", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter, NullFormatter

    lengths = sorted(summary.eval_len.unique())
    ax.set_xticks(lengths, [str(int(n)) for n in lengths])
    ax.xaxis.set_minor_formatter(NullFormatter())
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity")
    ax.set_title(title or f"perplexity vs length (train_len={', '.join(map(str, sorted(summary.train_len.unique())))})")
    ax.grid(True, which="both", alpha=0.3)
    if many:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize="small")
    fig.tight_layout()
    atomic_write(Path(path), lambda f: fig.savefig(f, format=Path(path).suffix.lstrip(".") or "png", dpi=120))
    plt.close(fig)


def failed_runs(paths: list[str | Path]) -> list[tuple[str, str]]:
    """(job dir, error) for every sweep job under ``paths`` that failed: posbench writes a
    ``FAILED`` file (the error on its first line) in the job dir instead of results."""
    files = [f for p in map(Path, paths) if p.is_dir() for f in sorted(p.rglob("FAILED"))]
    return [(str(f.parent), (f.read_text(errors="replace").splitlines() or ["(no message)"])[0]) for f in files]


def failures_markdown(failed: list[tuple[str, str]]) -> str:
    if not failed:
        return ""
    rows = [f"| {run} | {error.replace('|', '/')} |" for run, error in failed]
    return "\n".join([f"\n\n{len(failed)} failed run(s), no results:\n", "| run | error |", "|---|---|", *rows])


def report(paths: list[str | Path], out: str | Path | None = None) -> tuple[pd.DataFrame, str, Path]:
    """Gather results, write ``report.csv`` (tidy summary), ``report.md`` and ``report.png``
    into ``out`` (default: the single directory given, else ./report). Failed sweep jobs are
    listed under the table with their errors."""
    failed = failed_runs(paths)
    try:
        df = collect(paths)
    except PosbenchError as e:
        if not failed:
            raise
        raise PosbenchError(f"{e}; {len(failed)} run(s) failed: "
                            + "; ".join(f"{run}: {error}" for run, error in failed)) from e
    summary = summarize(df)
    table = markdown_table(summary) + failures_markdown(failed)
    if out is None:
        out = Path(paths[0]) if len(paths) == 1 and Path(paths[0]).is_dir() else Path("report")
    out = Path(out)
    atomic_write_text(out / "report.csv", summary.to_csv(index=False))
    atomic_write_text(out / "report.md", table + "\n")
    plot_ppl_vs_length(summary, out / "report.png")
    return summary, table, out
