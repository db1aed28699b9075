"""The README's table of a pretrained model under inference-time methods: each line's perplexity
at every length with its 95% interval, "as trained" where the method leaves the model as trained
(its row is the unscaled one: the same perplexity to the last bit), and its own ratio at the
longest length to its ppl at the trained context, from the study's report.csv.

    python scripts/method_table.py results/pretrained/smollm2-135m/report.csv

results/pretrained/smollm2-135m/README.md quotes its output; tests/test_readme_tables.py
regenerates it and fails where the README holds another version. Lines as the report orders
them, the model as trained first; non-overlapping windows; lengths in thousands of tokens.
"""

from __future__ import annotations

import argparse

import pandas as pd


def _k(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def method_table(summary: pd.DataFrame) -> str:
    s = summary[summary["mode"] == "nonoverlapping"]
    tlen = int(s.train_len.iloc[0])
    lengths = sorted(s.eval_len.unique())
    longest = lengths[-1]
    labels = list(dict.fromkeys(s.label))
    plain = s[s.label == s.encoding].set_index("eval_len").ppl_mean  # the model as trained
    head = ["method", *(_k(int(L)) for L in lengths), f"{_k(int(longest))} / own {_k(tlen)}"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in sorted(labels, key=lambda name: name != s.encoding.iloc[0]):
        line = s[s.label == label].set_index("eval_len")
        cells = []
        for L in lengths:
            if L not in line.index:
                cells.append("")
            elif label != s.encoding.iloc[0] and line.ppl_mean[L] == plain.get(L):
                cells.append("as trained")
            else:
                cells.append(f"{line.ppl_mean[L]:.2f} [{line.ppl_ci_low[L]:.2f}, {line.ppl_ci_high[L]:.2f}]")
        at = line.loc[longest] if longest in line.index else None
        ratio = "" if at is None else f"{at.ratio_mean:.3f} [{at.ratio_ci_low:.3f}, {at.ratio_ci_high:.3f}]"
        out.append("| " + " | ".join([f"`{label}`", *cells, ratio]) + " |")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", help="a report.csv of a pretrained model's study")
    args = ap.parse_args(argv)
    print(method_table(pd.read_csv(args.report)))


if __name__ == "__main__":
    main()
