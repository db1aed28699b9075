"""The README's LongPPL table of a pretrained model: each method's LongPPL with its 95% interval at
every length past the evaluator's long row, under one or more key-token choices (a report's
longppl.csv, then each --also file: another short context's), and its perplexity at the longest
length. Lines ordered by the first file's LongPPL at the longest length, lowest first; the
non-overlapping lines only (the evaluator's sliding rows are the judge, not a method).

    python scripts/longppl_table.py results/pretrained/smollm2-135m/longppl.csv \\
        --also results/pretrained/smollm2-135m/longppl_short2048.csv

results/pretrained/smollm2-135m/README.md quotes its output; tests/test_readme_tables.py
regenerates it and fails where the README holds another version.
"""

from __future__ import annotations

import argparse

import pandas as pd


def _k(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _value(x: float) -> str:
    """Two decimals, none from 100 on (a LongPPL of thousands needs no hundredths)."""
    return f"{x:.0f}" if x >= 100 else f"{x:.2f}"


def longppl_table(tables: list[pd.DataFrame]) -> str:
    first = tables[0]
    past = int(first.long_len.iloc[0])
    plain = [t[~t.line.str.contains(" sliding/")] for t in tables]
    lengths = sorted(L for L in plain[0].eval_len.unique() if L > past)
    longest = lengths[-1]
    order = plain[0][plain[0].eval_len == longest].sort_values("longppl").line.tolist()
    head = ["method"] + [f"{_k(int(L))} (short {_k(int(t.short_len.iloc[0]))})" for t in plain for L in lengths]
    head.append(f"ppl {_k(int(longest))}")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for line in order:
        cells = []
        for t in plain:
            rows = t[t.line == line].set_index("eval_len")
            for L in lengths:
                r = rows.loc[L] if L in rows.index else None
                cells.append("" if r is None else
                             f"{_value(r.longppl)} [{_value(r.longppl_ci_low)}, {_value(r.longppl_ci_high)}]")
        ppl = plain[0][(plain[0].line == line) & (plain[0].eval_len == longest)].ppl.iloc[0]
        out.append("| " + " | ".join([f"`{line}`", *cells, f"{ppl:.2f}"]) + " |")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("longppl", help="a report's longppl.csv")
    ap.add_argument("--also", action="append", default=[], help="another key-token choice's longppl csv")
    args = ap.parse_args(argv)
    print(longppl_table([pd.read_csv(p) for p in [args.longppl, *args.also]]))


if __name__ == "__main__":
    main()
