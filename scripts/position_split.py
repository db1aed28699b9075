"""Where in the window two train lengths differ: each line's mean NLL at one evaluation length,
split at the shorter train length into the positions every column trained on and the ones only
the longer column did.

    python scripts/position_split.py results/scale/runs/tiny results/scale/runs/tiny_seeds \\
        results/train_len/runs --length 512

A model trained at 512 that scores worse at 512 than one trained at 128 may be worse everywhere
in the window (a worse model, or a bug), or only at the first positions, which it saw four times
less often in training at the same tokens a step (16 windows a step against 64), while better at
the positions 128..511 only it was trained on. Its mean over the window cannot tell these apart;
this table can. Per line and train length: the token-weighted mean NLL of each part of the window
(from each run's positions.csv, the validation split's non-overlapping windows of ``--length``),
averaged over seeds, with the seeds' range; the difference of the two columns' means; ppl over the
whole window (the geometric mean over seeds, as the report's cells); then, per part, the lines
whose seeds at the longer train length all lie above (or below) every seed at the shorter. The
ranges are the seeds' only: both columns score the same tokens (checked: every run's bins hold the same token counts),
so the text's own variation is not sampled here.
"""

from __future__ import annotations

import argparse
import math
import sys

import pandas as pd

from posbench.errors import PosbenchError
from posbench.report.collect import check_one_config, check_one_run_per_seed, collect

DEFAULTS = {"scaling": "none", "rope_scaling": "none", "method": "none"}  # a plain evaluation's values


def part_nll(runs: pd.DataFrame, cuts: list[int]) -> pd.DataFrame:
    """Per run: the token-weighted mean NLL over positions [cuts[i], cuts[i+1]) and over the whole
    window (``all``). A cut inside a position bin is refused (the bins cannot be split)."""
    starts = set(runs.bin_start)
    for c in cuts[1:-1]:
        if c not in starts:
            raise SystemExit(f"position_split: the cut at position {c} falls inside a bin of positions.csv; "
                             f"valid: a train length that starts a bin ({', '.join(map(str, sorted(starts)))})")
    out = []
    for (encoding, train_len, seed), r in runs.groupby(["encoding", "train_len", "seed"]):
        row = {"encoding": encoding, "train_len": int(train_len), "seed": int(seed)}
        for lo, hi in zip(cuts, cuts[1:]):
            part = r[(r.bin_start >= lo) & (r.bin_start < hi)]
            row[(lo, hi)] = float((part.nll * part.tokens).sum() / part.tokens.sum())
        row["all"] = float((r.nll * r.tokens).sum() / r.tokens.sum())
        out.append(row)
    return pd.DataFrame(out)


def read(paths: list[str], length: int) -> pd.DataFrame:
    """The positions rows of a plain evaluation at ``length`` (validation split, non-overlapping),
    every run scoring the same tokens, each (encoding, train length) one config and each of its
    seeds one run."""
    df = collect(paths, "positions.csv")
    if df.empty:
        raise SystemExit(f"position_split: no positions.csv under {', '.join(paths)}")
    for key, value in DEFAULTS.items():
        df[key] = df[key].fillna(value) if key in df else value
    at = df[(df.eval_len == length) & (df.split == "validation") & (df["mode"] == "nonoverlapping")
            & (df.scaling == "none") & (df.rope_scaling == "none") & (df.method == "none")]
    if at.empty:
        have = ", ".join(map(str, sorted(df.eval_len.unique())))
        raise SystemExit(f"position_split: no run was evaluated at --length {length}; valid: {have}")
    try:  # the report's own checks, so the script and the report refuse the same runs
        check_one_config(at, who="position_split", remedy="pass the dirs of one config per line and train length")
        check_one_run_per_seed(at, who="position_split", remedy="pass dirs holding each seed once")
    except PosbenchError as e:
        raise SystemExit(str(e)) from None
    counts = at.groupby(["run"]).apply(lambda r: tuple(zip(r.bin_start, r.tokens)), include_groups=False)
    if counts.nunique() > 1:
        odd = counts[counts != counts.mode().iloc[0]].index[0]
        raise SystemExit(f"position_split: {odd} scores other tokens at {length} than the other runs "
                         f"(bin token counts differ): one token set a table")
    return at


def table(paths: list[str], length: int) -> str:
    at = read(paths, length)
    lens = sorted(int(t) for t in at.train_len.unique())
    if len(lens) < 2:
        raise SystemExit(f"position_split: the runs have one train length ({lens[0]}); "
                         "valid: dirs holding two or more, to compare")
    cuts = [0, *[t for t in lens if t < length], length]
    runs = part_nll(at, cuts)
    parts = [*zip(cuts, cuts[1:])]
    low, high = lens[0], lens[-1]

    def cell(line: pd.DataFrame, key) -> str:
        v = line[key]
        return f"{v.mean():.3f}" + (f" [{v.min():.3f}, {v.max():.3f}]" if len(v) > 1 else "")

    head = ["encoding", f"seeds ({' / '.join(map(str, lens))})"]
    for lo, hi in parts:
        head += [f"NLL at {lo}-{hi - 1}, train_len {t}" for t in lens] + [f"{high} - {low}"]
    head += [f"ppl({length}), train_len {t}" for t in lens]
    out = [f"NLL by part of the window at L={length}: mean over seeds [the seeds' range]", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for encoding, line in runs.groupby("encoding"):
        by = {t: line[line.train_len == t] for t in lens}
        cells = [encoding, " / ".join(str(len(by[t])) for t in lens)]
        for part in parts:
            cells += [cell(by[t], part) if len(by[t]) else "-" for t in lens]
            both = len(by[low]) and len(by[high])
            cells.append(f"{by[high][part].mean() - by[low][part].mean():+.3f}" if both else "-")
        cells += [f"{math.exp(by[t]['all'].mean()):.2f}" if len(by[t]) else "-" for t in lens]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", f"Where the seeds of train_len {high} fell against those of {low} (ranges, not intervals: a few "
            "seeds say where their draws fell, not where a rerun lands):"]
    out += [f"- positions {lo}-{hi - 1}: {placed(runs, (lo, hi), low, high)}" for lo, hi in parts]
    return "\n".join(out)


def placed(runs: pd.DataFrame, part, low: int, high: int) -> str:
    """The lines whose seeds at ``high`` all lie above (or all below) every seed at ``low`` in ``part``,
    and those whose ranges overlap; lines of one column only are left out."""
    sides = {"above": [], "below": [], "ranges overlap": []}
    for encoding, line in runs.groupby("encoding"):
        a, b = line[line.train_len == low][part], line[line.train_len == high][part]
        if not len(a) or not len(b):
            continue
        side = "above" if b.min() > a.max() else "below" if b.max() < a.min() else "ranges overlap"
        sides[side].append(f"{encoding} ({len(b)} / {len(a)} seeds)")
    return "; ".join(f"{side}: {', '.join(names) or 'none'}" for side, names in sides.items())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", help="run or sweep dirs, of two or more train lengths")
    parser.add_argument("--length", type=int, required=True, help="the evaluation length (L) to split")
    ns = parser.parse_args(argv)
    print(table(ns.dirs, ns.length))


if __name__ == "__main__":
    main(sys.argv[1:])
