"""How far one run moves when it is trained again at the same config and seed, across what a
user changes without thinking: the thread count, eager against compiled.

    python scripts/rerun_spread.py --out outputs/rerun > results/rerun/rerun.md

Trains seed 0 of a line that holds (alibi) and one that breaks (sinusoidal) at the zoo_quick
budget under each setting (``OMP_NUM_THREADS`` 1 and 2, ``train.compile`` false and true: none
of them is part of the config hash, so every run is "the same run"), one at a time, each
evaluated as the study evaluates it; runs already finished are read, not trained again. Then it
prints, per line, ppl at 1x and the 16x ratio of each setting beside the spread of the same
line over seeds (the 24 seeds of ``results/seed_coverage/runs`` where they exist): a rerun
that moves by a small fraction of one seed's spread is covered by the seed term of every
interval, one that moves by as much is a term the intervals lack.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from posbench.eval.results import read_results  # noqa: E402

ENCODINGS = ("alibi", "sinusoidal")
SETTINGS = {  # name -> (environment, overrides)
    "1 thread, eager": ({"OMP_NUM_THREADS": "1"}, ["train.compile=false"]),
    "2 threads, eager": ({"OMP_NUM_THREADS": "2"}, ["train.compile=false"]),
    "2 threads, compiled": ({"OMP_NUM_THREADS": "2"}, ["train.compile=true"]),
}


def folder(setting: str) -> str:
    return setting.replace(", ", "_").replace(" ", "")


def train(out: Path, setting: str, encoding: str) -> Path:
    env, overrides = SETTINGS[setting]
    run = out / folder(setting) / encoding
    if not (run / "results.csv").is_file():
        cmd = [sys.executable, "-m", "posbench.cli", "train", "experiment=zoo_quick", f"encoding={encoding}",
               "seed=0", f"hydra.run.dir={run}", *overrides]
        print("$", " ".join(f"{k}={v}" for k, v in env.items()), " ".join(cmd[2:]), file=sys.stderr)
        subprocess.run(cmd, check=True, env={**os.environ, **env}, stdout=sys.stderr)  # its table is not ours
    return run


def measures(rows: pd.DataFrame) -> tuple[float, float]:
    """(ppl at train_len, ppl at 16x / ppl at train_len) of one run's non-overlapping rows."""
    rows = rows[(rows["mode"] == "nonoverlapping") & (rows.split == "validation")].set_index("eval_len")
    tlen = int(rows.train_len.iloc[0])
    return float(rows.ppl[tlen]), float(rows.ppl[16 * tlen] / rows.ppl[tlen])


def seed_spread(runs: Path, encoding: str) -> tuple[int, float, float]:
    """(seeds, sd of log ppl at 1x, sd of the log 16x ratio) over the seeds under ``runs``."""
    found = [measures(read_results(p)) for p in sorted((runs / encoding).glob("seed=*/results.csv"))]
    if len(found) < 2:
        return len(found), math.nan, math.nan
    ppl, ratio = np.log(np.array(found)).T
    return len(found), float(ppl.std(ddof=1)), float(ratio.std(ddof=1))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="outputs/rerun", help="where the reruns are trained (default outputs/rerun)")
    ap.add_argument("--seeds", default="results/seed_coverage/runs", help="the seeds to compare with")
    args = ap.parse_args(argv)
    out = Path(args.out)
    print("# One run trained again: thread count, eager against compiled\n")
    print(f"`python scripts/rerun_spread.py --out {args.out}`: seed 0 of experiment=zoo_quick per line, each "
          "setting a fresh training run; the log differences are to the first setting.\n")
    print("| line | setting | ppl at 1x | 16x ratio | log ppl vs first | log ratio vs first |")
    print("|---|---|---|---|---|---|")
    moves: dict[str, list[tuple[float, float]]] = {}
    for encoding in ENCODINGS:
        first = None
        for setting in SETTINGS:
            ppl, ratio = measures(read_results(train(out, setting, encoding) / "results.csv"))
            first = first or (ppl, ratio)
            d = (math.log(ppl / first[0]), math.log(ratio / first[1]))
            moves.setdefault(encoding, []).append(d)
            print(f"| {encoding} | {setting} | {ppl:.3f} | {ratio:.4f} | {d[0]:+.5f} | {d[1]:+.5f} |")
    print("\n| line | largest rerun move, log ppl | seeds | one seed's sd, log ppl | largest move, log ratio | "
          "one seed's sd, log ratio |\n|---|---|---|---|---|---|")
    for encoding in ENCODINGS:
        n, sd_ppl, sd_ratio = seed_spread(Path(args.seeds), encoding)
        big = np.abs(np.array(moves[encoding])).max(0)
        print(f"| {encoding} | {big[0]:.5f} | {n} | {sd_ppl:.5f} | {big[1]:.5f} | {sd_ratio:.5f} |")


if __name__ == "__main__":
    main()
