"""The default job eager and under ``train.compile=true``: speed, and whether the models agree.

Trains ``posbench train encoding=E`` (the default job: 400 steps, evaluation at 1x..16x) per
encoding twice with the same seed and thread policy, eager and compiled, one after the other
(eager first, so a disturbance of the machine falls on both settings of an encoding rather
than on one setting of all), after one short run has built the corpus cache they share.
Prints (and writes with --out) per run the wall time, the median training tokens/s over the
logged intervals (the first interval, which holds the compilation, is left out of the median),
the compile overhead, and the perplexity at each length with the compiled run's difference
from the eager one.

    python scripts/compile_speed.py --encodings alibi rope --out results/bench/compile.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def run_job(run_dir: Path, *overrides: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "posbench.cli", "train", f"hydra.run.dir={run_dir}", *overrides],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env=dict(os.environ))
    return time.perf_counter() - start


def measure(run: Path, wall: float) -> dict:
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steady = [m["tokens_per_s"] for m in metrics[1:] if "tokens_per_s" in m] or [metrics[0]["tokens_per_s"]]
    results = pd.read_csv(run / "results.csv").sort_values("eval_len")
    return {"wall": wall, "tok_s": statistics.median(steady), "threads": sorted({m.get("threads") for m in metrics}),
            "ppl": dict(zip(results.eval_len.astype(int), results.ppl))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encodings", nargs="+", default=["alibi", "rope"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides for every run (e.g. train.steps=100)")
    parser.add_argument("--out", help="also write the table here (Markdown)")
    parser.add_argument("--runs", default="outputs/compile_speed", help="run dirs go here (replaced)")
    ns = parser.parse_args()
    runs = ROOT / ns.runs
    shutil.rmtree(runs, ignore_errors=True)
    run_job(runs / "warm", "train.steps=1", *ns.extra)  # builds the corpus cache every job reads
    lines, found = [], {}
    for encoding in ns.encodings:
        for setting, flag in (("eager", "false"), ("compiled", "true")):
            print(f"training {encoding} {setting} ...", file=sys.stderr, flush=True)
            run = runs / encoding / setting
            overrides = [f"encoding={encoding}", f"seed={ns.seed}", f"train.compile={flag}", *ns.extra]
            found[encoding, setting] = measure(run, run_job(run, *overrides))
        eager, compiled = found[encoding, "eager"], found[encoding, "compiled"]
        lengths = sorted(eager["ppl"])
        for setting, m in (("eager", eager), ("compiled", compiled)):
            # training time in tokens/s: the compiled run's extra wall time is its compilation
            # plus whatever its steady speed saves or costs
            cells = [f"{m['ppl'][n]:.2f}" + ("" if m is eager else f" ({m['ppl'][n] / eager['ppl'][n] - 1:+.2%})")
                     for n in lengths]
            lines.append(f"| {encoding} | {setting} | {m['wall']:.0f} | {m['tok_s']:,.0f} | "
                         f"{m['tok_s'] / eager['tok_s']:.2f}x | {','.join(map(str, m['threads']))} | "
                         + " | ".join(cells) + " |")
    header = ("| encoding | setting | wall s | median train tok/s | vs eager | threads | "
              + " | ".join(f"ppl L={n}" for n in lengths) + " |\n|" + "---|" * (6 + len(lengths)) + "\n")
    text = (header + "\n".join(lines) + "\n\n"
            f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
            f"overrides: {' '.join(ns.extra) or '(none)'}; seed {ns.seed}.\n")
    print(text)
    if ns.out:
        command = " ".join(["python scripts/compile_speed.py", "--encodings", *ns.encodings,
                            *(["--extra", *(f"'{e}'" for e in ns.extra)] if ns.extra else []), "--runs", ns.runs,
                            "--out", ns.out])
        Path(ns.out).write_text(f"`{command}`\n\n" + text)


if __name__ == "__main__":
    main()
