"""per.png: each line against a ``--per`` key's values (a budget study's lines against the budget).

With ``posbench report --per train.steps`` the table has one row per (line, budget) and the ranked
figure one point each; what a reader of a budget study asks first is how each line moves with
the budget. This figure answers it: one curve per line (its name without the key, as the
verdicts name it), its ppl at train_len in the left panel and its ppl(Mx) / ppl(1x) in the right
(Mx: the longest length past train_len every row reached), each point with its 95% interval from the table.
"""

from __future__ import annotations

import pandas as pd

from .figures import _caption, _pyplot
from .verdicts import common_longest, numeric_first, per_split


def per_rows(summary: pd.DataFrame, key: str) -> pd.DataFrame:
    """``summary`` with ``name`` (the label without ``key``'s ``k=v``) and ``value`` (the key's value,
    a number where every one reads as one); rows whose label lacks the key are left out."""
    names, values = per_split(summary, key)
    rows = summary.assign(name=names.to_numpy(), value=values.to_numpy())
    rows = rows[rows.value.notna()]
    return rows.assign(value=numeric_first(rows.value.reset_index(drop=True)).to_numpy())


def per_figure(summary: pd.DataFrame, key: str, setup: pd.DataFrame | None = None):
    """The figure (module docstring), or None where fewer than two of the key's values are
    numbers or the lines have no common train_len."""
    rows = per_rows(summary, key)
    if rows.empty or rows.value.nunique() < 2 or not pd.api.types.is_numeric_dtype(rows.value) \
            or rows.train_len.nunique() != 1:
        return None
    plt = _pyplot()
    from matplotlib.ticker import FormatStrFormatter, LogLocator

    tlen = int(rows.train_len.iloc[0])
    longest = common_longest(rows)  # rows keep their labels: one line per (name, value)
    longest = longest if longest is not None and longest > tlen else None
    fig, axes = plt.subplots(1, 2 if longest else 1, figsize=(11 if longest else 5.8, 4.4), squeeze=False)
    panels = [("ppl", tlen, f"perplexity at train_len ({tlen})")]
    if longest:
        panels.append(("ratio", longest, f"ppl({longest}) / ppl({tlen}) ({longest / tlen:g}x)"))
    for ax, (what, length, title) in zip(axes[0], panels):
        at = rows[rows.eval_len == length]
        for i, (name, g) in enumerate(at.groupby("name", sort=True)):
            g = g.sort_values("value")
            mean, low, high = (g[f"{what}_mean"], g[f"{what}_ci_low"], g[f"{what}_ci_high"])
            ax.errorbar(g.value, mean, yerr=[(mean - low).clip(lower=0), (high - mean).clip(lower=0)],
                        marker="o", capsize=3, color=f"C{i % 10}", label=name)
        if what == "ratio":
            ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(sorted(rows.value.unique()), [f"{v:g}" for v in sorted(rows.value.unique())])
        ax.minorticks_off()
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.set_xlabel(key)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    _caption(fig, setup, "bars: 95% intervals (the seeds' spread and the text's)")
    fig.tight_layout()
    return fig


def per_figures(summary: pd.DataFrame, per: list[str], setup: pd.DataFrame | None = None) -> dict:
    """``{"per": figure}`` for one ``--per`` key whose figure can be drawn, else ``{}``."""
    fig = per_figure(summary, per[0], setup) if len(per) == 1 else None
    return {} if fig is None else {"per": fig}
