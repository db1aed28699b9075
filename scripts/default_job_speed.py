"""The default job, `posbench train encoding=alibi`, at a base commit and at this checkout.

Both run here, one after the other, in fresh run dirs (outputs/default_job/before and
after, replaced if there), after one short run has built the corpus cache they share, so the
figures differ only by the code. Prints (and writes with --out) wall time, median training
tokens/s over the logged intervals, and the perplexities.

    python scripts/default_job_speed.py BASE_COMMIT [--out results/bench/default_job.md]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def run_job(source: Path, run_dir: Path, *extra: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(source)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "posbench.cli", "train", "encoding=alibi", f"hydra.run.dir={run_dir}", *extra],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=source)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the commit to compare with (e.g. the one before a performance change)")
    parser.add_argument("--out", help="also write the table here (Markdown)")
    ns = parser.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    base = subprocess.run(["git", "rev-parse", "--short", ns.base], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    runs = ROOT / "outputs" / "default_job"
    shutil.rmtree(runs, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run(["git", "worktree", "add", "--quiet", "--detach", str(tmp / "base"), base], cwd=ROOT, check=True)
        try:
            run_job(ROOT, tmp / "warm", "train.steps=1")  # builds the corpus cache both jobs read
            rows = []
            for name, source in ((f"before ({base})", tmp / "base"), (f"after ({head})", ROOT)):
                print(f"running the default job at {name} ...", file=sys.stderr)
                run = runs / name.split()[0]
                wall = run_job(source, run)
                metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
                results = pd.read_csv(run / "results.csv").sort_values("eval_len")
                rows.append({"code": name, "wall s": f"{wall:.0f}",
                             "median train tok/s": f"{statistics.median(m['tokens_per_s'] for m in metrics):,.0f}",
                             **{f"ppl L={n}": f"{p:.2f}" for n, p in zip(results.eval_len, results.ppl)}})
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tmp / "base")], cwd=ROOT, check=False)
    table = pd.DataFrame(rows)
    speedup = float(rows[0]["wall s"]) / float(rows[1]["wall s"])
    text = ("| " + " | ".join(table.columns) + " |\n|" + "---|" * len(table.columns) + "\n"
            + "\n".join("| " + " | ".join(map(str, r)) + " |" for r in table.values.tolist())
            + f"\n\nWall-time speed-up: {speedup:.2f}x\n")
    print(text)
    if ns.out:
        Path(ns.out).write_text(f"`python scripts/default_job_speed.py {ns.base} --out {ns.out}`\n\n" + text)


if __name__ == "__main__":
    main()
