"""How far the thread count moves a trained model's perplexity, beside how far the seed does.

The same config and seed trained with 1 and with 2 intra-op threads is not the same model on a
CPU: reductions sum in another order, the rounding differs at the first step and the runs drift
apart. This compares, per encoding, seed 0 trained with 1 thread (the runs of a sweep whose
jobs ran side by side, one thread each) and with 2 threads (``OMP_NUM_THREADS=2``), at the train
length and at the longest eval length, against the spread over seeds at 1 thread.

    python scripts/thread_spread.py outputs/baseline_zoo_quick outputs/threads_zoo_quick \
        --out results/bench/thread_spread.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd


def threads_of(run: Path) -> set[int]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {json.loads(line).get("threads") for line in lines if line.strip()}


def rows(root: Path) -> pd.DataFrame:
    frames = []
    for results in sorted(root.rglob("results.csv")):
        run = results.parent
        found = threads_of(run)
        if len(found) != 1:
            raise SystemExit(f"{run}: trained with thread counts {sorted(found)}, not one; rerun it with OMP_NUM_THREADS")
        frames.append(pd.read_csv(results).assign(threads=found.pop(), run=str(run)))
    return pd.concat(frames, ignore_index=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", help="run or sweep dirs holding the 1- and 2-thread runs")
    parser.add_argument("--out", help="also write the table here (Markdown)")
    ns = parser.parse_args()
    df = pd.concat([rows(Path(d)) for d in ns.dirs], ignore_index=True)
    df = df[df.status == "ok"]
    lengths = sorted({int(df.train_len.min()), int(df.eval_len.max())})
    lines = ["| encoding | L | ppl, seed 0, 1 thread | ppl, seed 0, 2 threads | 2 vs 1 thread | seeds' sd / mean (1 thread, n) |",
             "|---|---|---|---|---|---|"]
    for enc, g in df.groupby("encoding"):
        for length in lengths:
            at = g[g.eval_len == length]
            one = at[(at.threads == 1) & (at.seed == 0)].ppl
            two = at[(at.threads == 2) & (at.seed == 0)].ppl
            seeds = at[at.threads == 1].ppl
            if one.empty or two.empty:
                continue
            change = two.iloc[0] / one.iloc[0] - 1
            spread = seeds.std(ddof=1) / seeds.mean() if len(seeds) > 1 else float("nan")
            lines.append(f"| {enc} | {length} | {one.iloc[0]:.2f} | {two.iloc[0]:.2f} | {change:+.2%} | "
                         f"{spread:.2%} ({len(seeds)}) |")
    table = "\n".join(lines)
    print(table)
    if ns.out:
        Path(ns.out).write_text(table + "\n")


if __name__ == "__main__":
    main()
