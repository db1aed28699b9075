"""README's encoding table from a report: name, paper, hook, measured ppl at train_len and at
the longest length, their ratio, and a verdict.

    python scripts/encoding_table.py results/zoo_quick/report.csv > results/zoo_quick/encodings.md

Verdict: "yes" if ppl(longest) <= 1.05 x ppl(train_len),
"partly" up to 1.5x, "no" beyond or where the encoding cannot run that long.
"""

import math
import sys

import pandas as pd

from posbench.encodings import REGISTRY


def verdict(ratio: float) -> str:
    if math.isnan(ratio):
        return "no (cannot run that long)"
    return "yes" if ratio <= 1.05 else "partly" if ratio <= 1.5 else "no"


def main(path: str) -> None:
    df = pd.read_csv(path)
    df = df[df.rope_scaling.fillna("none") == "none"] if "rope_scaling" in df else df
    df = df[df["mode"].fillna("nonoverlapping") == "nonoverlapping"] if "mode" in df else df  # plain lines only
    lines = ["| encoding | paper | hook | ppl at train_len | ppl at 16x | ratio | extrapolates? |",
             "|---|---|---|---|---|---|---|"]
    rows = []
    for enc, g in df.groupby("encoding"):
        tlen = g.train_len.iloc[0]
        base = g[g.eval_len == tlen].ppl_mean.iloc[0]
        longest = g[g.eval_len == g.eval_len.max()].ppl_mean.iloc[0]
        rows.append((longest / base if base == base and longest == longest else math.nan, enc, base, longest))
    for ratio, enc, base, longest in sorted(rows, key=lambda r: (math.isnan(r[0]), r[0])):
        cls = REGISTRY.get(enc)
        paper, hook = (cls.paper, cls.hook_kind()) if cls else ("", "")
        fmt = lambda v: "n/a" if v != v else f"{v:.1f}"
        lines.append(f"| `{enc}` | {paper} | {hook} | {fmt(base)} | {fmt(longest)} | "
                     f"{'n/a' if ratio != ratio else f'{ratio:.2f}'} | {verdict(ratio)} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1])
