"""docs/encodings.md's encoding table from a report: one row per line (encoding, or encoding and the
``--by`` values that set it apart), its paper, hook, parameter count (position parameters in
brackets), measured ppl at train_len and at the longest length, their ratio with its 95% interval,
and a verdict.

    python -m posbench.report.encoding_table results/zoo_quick/report.csv > results/zoo_quick/encodings.md

A study writes it beside its report with ``report: tables: {encodings.md: encodings}`` (:data:`TABLES`).

Verdict, from the interval of ppl(longest) / ppl(train_len) (report.csv's ratio_ci_low and
ratio_ci_high): "yes" if the whole interval is <= 1.05, "partly" if it lies within (1.05, 1.5],
"no" if it lies above 1.5 or the encoding cannot run that long. An interval that straddles 1.05
or 1.5 supports neither side: "not distinguishable (yes/partly)"; one that is missing, "no interval".
Rows are sorted by the ratio's point estimate, which is no ranking where intervals overlap.
A line set apart by ``--by`` options shows only the values that differ from what most lines
have (``posbench.eval.results.compact_names``, from report.csv's ``by:`` columns): the report's
``rope [length_scaling=none, qk_norm=False, window=128]`` is ``rope [window=128]``, and a line
under the table names the values left out.
"""

from __future__ import annotations

import math
import sys

from ..encodings import REGISTRY
from ..eval.results import as_trained, compact_names, read_table

HOLDS, BREAKS = 1.05, 1.5  # a ratio up to HOLDS: "yes"; past BREAKS: "no" (the bounds every report reads)
BOUNDS = ((HOLDS, "yes"), (BREAKS, "partly"), (math.inf, "no"))


def _grade(ratio: float) -> str:
    return next(name for bound, name in BOUNDS if ratio <= bound)


def verdict(ratio: float, low: float = math.nan, high: float = math.nan) -> str:
    if math.isnan(ratio):
        return "no (cannot run that long)"
    if math.isnan(low) or math.isnan(high):
        return "no interval"
    lo, hi = _grade(low), _grade(high)
    return lo if lo == hi else f"not distinguishable ({lo}/{hi})"


def _ppl(value: float) -> str:
    return "n/a" if value != value else f"{value:.1f}"


def table(path: str) -> str:
    """The encoding table (module docstring) of the report.csv at ``path``, as markdown."""
    df = read_table(path)
    df = df[as_trained(df)]
    df = df[df["mode"].fillna("nonoverlapping") == "nonoverlapping"] if "mode" in df else df  # plain lines only
    by = "label" if "label" in df else "encoding"  # a line per label: `posbench report --by` variants apart
    lines = ["| line | paper | hook | params (position) | ppl at train_len | ppl at 16x | ratio [95% interval] | "
             "extrapolates? |", "|---|---|---|---|---|---|---|---|"]
    rows = []
    for label, g in df.groupby(by):
        tlen = g.train_len.iloc[0]
        base = g[g.eval_len == tlen].ppl_mean.iloc[0]
        longest = g[g.eval_len == g.eval_len.max()].iloc[0]
        ratio, low, high = (float(longest.get(c, math.nan)) for c in ("ratio_mean", "ratio_ci_low", "ratio_ci_high"))
        params = (float(g.params.iloc[0]), float(g.pos_params.iloc[0])) if "params" in g else (math.nan, math.nan)
        rows.append((ratio, label, str(g.encoding.iloc[0]), params, base, longest.ppl_mean, low, high))
    rows.sort(key=lambda r: (math.isnan(r[0]), r[0]))
    named = df.assign(name=df[by], label=df[by]) if "label" not in df else df.assign(name=df.label)
    shorts, common = compact_names(named)  # from the table's --by columns (report.csv), never its labels
    for ratio, label, enc, (params, pos), base, longest, low, high in rows:
        short = shorts.get(label, label)
        cls = REGISTRY.get(enc)
        paper, hook = (cls.paper, cls.hook_kind()) if cls else ("", "")
        count = "n/a" if params != params else f"{params / 1e6:.2f}M ({int(pos):,})"
        shown = "n/a" if ratio != ratio else f"{ratio:.3f}" + ("" if low != low else f" [{low:.3f}, {high:.3f}]")
        lines.append(f"| `{short}` | {paper} | {hook} | {count} | {_ppl(base)} | {_ppl(longest)} | {shown} | "
                     f"{verdict(ratio, low, high)} |")
    if common:
        lines += ["", f"Unless a line shows otherwise: {common}."]
    return "\n".join(lines) + "\n"


TABLES = {"encodings": table}  # what a study's report.tables names -> the function writing it from report.csv


if __name__ == "__main__":
    sys.stdout.write(table(sys.argv[1]))
