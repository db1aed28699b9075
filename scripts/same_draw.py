"""Whether two trainings of the same runs gave the same numbers: each (folder, seed) under both.

    python scripts/same_draw.py results/baselines/headline results/matched/runs/long

Pairs the runs of two trees by their path below each root (``rope/seed=1`` under both) and, for
each pair with the same config hash, prints the largest absolute difference in NLL over the
evaluation rows both have (same split, mode and length) and the 16x ratio of each. A difference
of 0 means the two trainings are one draw, bit for bit (the same machine kind repeats a seed); a
different machine kind rounds differently, which at 16x can move a line as far as a seed does.
Each run's ppl at its shortest length (1x) stands beside its ratio: what a change of machine
does to a line's level, apart from its extrapolation.
Runs whose config hashes differ are named and not compared.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from posbench.eval.results import read_results

KEY = ["split", "mode", "eval_len"]


def rows(run: Path) -> pd.DataFrame:
    df = read_results(run / "results.csv")  # backfilled: rows from before a column read as its default
    return df[df["status"] == "ok"] if "status" in df else df


def ladder(df: pd.DataFrame) -> pd.DataFrame:
    """The validation split's non-overlapping rows, shortest length first."""
    return df[(df["split"] == "validation") & (df["mode"] == "nonoverlapping")].sort_values("eval_len")


def ratio(df: pd.DataFrame) -> float:
    """ppl at the longest length over ppl at the shortest, on the validation split, non-overlapping."""
    d = ladder(df)
    return math.exp(d["nll"].iloc[-1] - d["nll"].iloc[0]) if len(d) > 1 else float("nan")


def first_ppl(df: pd.DataFrame) -> float:
    """ppl at the shortest length (1x), on the validation split, non-overlapping; nan without such rows."""
    d = ladder(df)
    return math.exp(d["nll"].iloc[0]) if len(d) else float("nan")


def compare(a: Path, b: Path) -> dict:
    ra, rb = rows(a), rows(b)
    hash_a, hash_b = ra["config_hash"].iloc[0], rb["config_hash"].iloc[0]
    out = {"hash_a": hash_a, "hash_b": hash_b, "same_config": hash_a == hash_b}
    if out["same_config"]:
        both = ra.merge(rb, on=KEY, suffixes=("_a", "_b"))
        out.update(rows=len(both), max_abs_nll_diff=float((both["nll_a"] - both["nll_b"]).abs().max()),
                   ppl_a=first_ppl(ra), ppl_b=first_ppl(rb), ratio_a=ratio(ra), ratio_b=ratio(rb),
                   code_a=ra["code_version"].iloc[0], code_b=rb["code_version"].iloc[0])
    return out


def pairs(root_a: Path, root_b: Path) -> list[tuple[str, Path, Path]]:
    found = []
    for csv in sorted(root_a.rglob("results.csv")):
        rel = csv.parent.relative_to(root_a)
        if (root_b / rel / "results.csv").is_file():
            found.append((str(rel), csv.parent, root_b / rel))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    ns = parser.parse_args()
    found = pairs(ns.a, ns.b)
    if not found:
        raise SystemExit(f"same_draw: no run is under both {ns.a} and {ns.b} (paired by their paths below each)")
    print(f"| run | rows | max abs NLL diff | ppl at 1x ({ns.a}) | ppl at 1x ({ns.b}) | 16x ratio ({ns.a}) | "
          f"16x ratio ({ns.b}) | code |")
    print("|---|---|---|---|---|---|---|---|")
    for rel, a, b in found:
        c = compare(a, b)
        if not c["same_config"]:
            print(f"| {rel} | config hashes differ: {c['hash_a']} / {c['hash_b']} | | | | | | |")
            continue
        print(f"| {rel} | {c['rows']} | {c['max_abs_nll_diff']:.3g} | {c['ppl_a']:.2f} | {c['ppl_b']:.2f} | "
              f"{c['ratio_a']:.3f} | {c['ratio_b']:.3f} | {c['code_a']} / {c['code_b']} |")


if __name__ == "__main__":
    main()
