"""Paired contrasts between lines of a study: ppl(A) / ppl(B) at one evaluation length, with the
95% interval `posbench report` gives its comparisons (seeds' spread by Welch, text's by the paired
block bootstrap over the scored tokens; posbench.intervals.Estimator).

    python scripts/contrasts.py ROOT A:B:L [A:B:L ...]

A and B are sweep folders under ROOT holding ``seed=<n>`` run dirs (e.g. finetune/pi/steps=100),
each optionally followed by ``@SCALING`` (the rope_scaling column: pi, yarn, rerope(W=64), ...;
default none); a line is its seeds' non-overlapping rows of that scaling at L. Runs keep their per-token NLL
(token_nll.npz) or, packed, its block sums (blocks.npz); both are read. Prints a Markdown table.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from posbench.intervals import Cell, Estimator
from posbench.report.baselines import run_blocks


def cell(root: Path, spec: str, length: int) -> Cell:
    """The seeds of the line ``spec`` (folder[@scaling]) at ``length``: their mean NLL and block sums."""
    folder, _, scaling = spec.partition("@")
    scaling, line = scaling or "none", root / folder
    runs = sorted(line.glob("seed=*"))
    if not runs:
        raise SystemExit(f"contrasts.py: no seed=<n> run dirs in {line}")
    key = f"validation/nonoverlapping/stride={length}/{scaling}/eval_len={length}"
    seeds, nll, blocks, sizes = [], [], [], None
    for run in runs:
        rows = pd.read_csv(run / "results.csv")
        row = rows[(rows["mode"] == "nonoverlapping") & (rows.rope_scaling == scaling) & (rows.eval_len == length)]
        if row.empty or key not in (sums := run_blocks(run)):
            raise SystemExit(f"contrasts.py: {run} has no non-overlapping row of {scaling} at L={length}")
        seeds.append(int(row.seed.iloc[-1]))
        nll.append(float(row.nll.iloc[-1]))
        blocks.append(sums[key][0])
        sizes = sums[key][1]
    return Cell(np.array(seeds), np.array(nll), np.stack(blocks), sizes, ("validation", length))


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    root, est = Path(argv[0]), Estimator()
    print("| A / B | L | ppl(A) / ppl(B) [95% interval] |\n|---|---|---|")
    for spec in argv[1:]:
        a, b, length = spec.rsplit(":", 2)
        i = est.difference(cell(root, a, int(length)), cell(root, b, int(length)))
        print(f"| {a} / {b} | {length} | {math.exp(i.estimate):.3f} [{math.exp(i.low):.3f}, {math.exp(i.high):.3f}] |")


if __name__ == "__main__":
    main(sys.argv[1:])
