"""How wide the report's bootstrap intervals are at each scored-token budget, and how the
bootstrap's standard error grows with the block length, from one run's token_nll.npz.

    posbench eval checkpoint=<run dir> eval.max_tokens=1000000    # every validation token
    python scripts/interval_width.py <run dir> [<other run dir>]

The first n' scored tokens are exactly what ``eval.max_tokens=n'`` scores (non-overlapping
windows start at token 1 at every budget, when n' is a multiple of every length), so one
evaluation of the whole split gives the interval at every smaller budget.

Two tables, for the run's non-overlapping lengths:

1. per budget n': the 95% half-width of ppl at train_len (the cell's interval) and of the
   paired ratio ppl(longest) / ppl(train_len), in % of the value (:mod:`posbench.intervals`);
2. per block length B (whole split): the standard error of the mean NLL at train_len and of the
   paired difference, sd(block means) / sqrt(blocks). Neighbouring tokens' losses correlate, so
   it grows with B until blocks are longer than that dependence, then levels off: the block
   length should sit on that plateau, with enough blocks left for the bootstrap (the report
   uses 20 blocks of n / 20 tokens).

With a second run scored on the same tokens (another encoding, seed or checkpoint), both tables
get a column for the paired comparison of the two models at train_len, as the report's bold and
its warning at train_len use it.
"""

import math
import sys
from pathlib import Path

import numpy as np

from posbench.intervals import Cell, Estimator, block_sums
from posbench.eval.results import read_results
from posbench.eval.token_nll import read_token_nll, row_key


def cell(x: np.ndarray) -> Cell:
    sums, sizes = block_sums(x)
    return Cell(np.array([0]), np.array([x.mean()]), sums[None], sizes, ("run", x.size))


def half_width(iv) -> float:
    """Half the interval's width, in % of exp(estimate)."""
    return 100 * (math.exp(iv.high) - math.exp(iv.low)) / 2 / math.exp(iv.estimate)


def token_losses(run: str) -> tuple[dict[int, np.ndarray], int]:
    """{eval_len: per-token NLL} of a run's plain non-overlapping rows, and its train_len."""
    results = read_results(Path(run) / "results.csv")
    plain = (results["mode"] == "nonoverlapping") & (results.rope_scaling == "none") & (results.status == "ok")
    results = results[plain]
    stored = read_token_nll(Path(run) / "token_nll.npz")
    return ({int(r["eval_len"]): stored[row_key(r)].astype(np.float64) for r in results.to_dict("records")},
            int(results.train_len.iloc[0]))


def main(run: str, other: str | None = None) -> None:
    by_len, train_len = token_losses(run)
    longest = max(by_len)
    base, far, n = by_len[train_len], by_len[longest], by_len[train_len].size
    rival = token_losses(other)[0][train_len] if other else None
    if rival is not None and rival.size != n:
        raise SystemExit(f"{other} scored {rival.size} tokens, {run} {n}: no pairing")
    est = Estimator()
    vs = f" ppl({other}) / ppl({run}) at L={train_len} ± % |" if other else ""
    print(f"{run}: {n} scored tokens, lengths {sorted(by_len)}, train_len {train_len}\n")
    print(f"| scored tokens | blocks x tokens | ppl(L={train_len}) ± % | "
          f"ppl(L={longest}) / ppl(L={train_len}) ± % |{vs}")
    print("|---|---|---|---|" + ("---|" if other else ""))
    budgets = sorted({b for b in (4096, 8192, 16384, 32768, 65536, 98304, n) if b <= n and b % longest == 0})
    for m in budgets:
        a, b = cell(base[:m]), cell(far[:m])
        row = (f"| {m:,} | {a.sizes.size} x {a.sizes.max()} | {half_width(est.cell(a)):.2f} | "
               f"{half_width(est.difference(b, a, same_models=True)):.2f} |")
        print(row + (f" {half_width(est.difference(cell(rival[:m]), a)):.2f} |" if other else ""))
    vs = f" s.e. paired difference {other} - {run} at L={train_len} |" if other else ""
    print(f"\n| block tokens | blocks | s.e. mean NLL at L={train_len} | "
          f"s.e. paired difference L={longest} - L={train_len} |{vs}")
    print("|---|---|---|---|" + ("---|" if other else ""))
    series = [base, far - base] + ([rival - base] if other else [])
    for size in (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, n // 20, 8192, n // 10):
        blocks = n // size
        se = [np.std(x[:blocks * size].reshape(blocks, size).mean(1), ddof=1) / math.sqrt(blocks) for x in series]
        print(f"| {size} | {blocks} | " + " | ".join(f"{v:.5f}" for v in se) + " |")


if __name__ == "__main__":
    main(*sys.argv[1:3])
