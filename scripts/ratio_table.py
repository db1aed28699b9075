"""The README's table of a study: each line's ppl at every length, its ratio at the longest and
its ppl at train_len over the lowest line's, with their 95% intervals, from the study's report.csv.

    python scripts/ratio_table.py results/headline/report.csv

READMEs quote its output (the top README and results/headline/README.md the headline's);
tests/test_readme_tables.py regenerates it and fails where a README holds another version.
Lines in ascending ppl at train_len; cells geometric mean ± std over seeds; ``1 (lowest)`` for the
line the others are divided by. One train_len, non-overlapping windows.
"""

from __future__ import annotations

import argparse

import pandas as pd


def ratio_table(summary: pd.DataFrame) -> str:
    s = summary[summary["mode"] == "nonoverlapping"]
    tlen = int(s.train_len.iloc[0])
    lengths = sorted(s.eval_len.unique())
    longest = lengths[-1]
    base = s[s.eval_len == tlen].sort_values("ppl_mean")
    head = ["encoding", "seeds", *(f"L={L}" for L in lengths), f"ppl({longest}) / ppl({tlen})", f"ppl({tlen}) / lowest"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in base.label:
        line = s[s.label == label].set_index("eval_len")
        at, one = line.loc[longest], line.loc[tlen]
        cells = [f"{line.ppl_mean[L]:.1f} ± {line.ppl_std[L]:.1f}" for L in lengths]
        ratio = f"{at.ratio_mean:.3f} [{at.ratio_ci_low:.3f}, {at.ratio_ci_high:.3f}]"
        vs = "1 (lowest)" if one.ppl_mean == base.ppl_mean.min() else \
            f"{one.vs_best:.3f} [{one.vs_best_ci_low:.3f}, {one.vs_best_ci_high:.3f}]"
        out.append("| " + " | ".join([label, str(int(one.seeds)), *cells, ratio, vs]) + " |")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", help="a report.csv")
    print(ratio_table(pd.read_csv(ap.parse_args(argv).report)))


if __name__ == "__main__":
    main()
