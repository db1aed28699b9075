"""A job alone and beside a busy process: how much a posbench job slows when it shares the CPU.

A user's machine is never idle. Each job below runs twice in a fresh run dir, once alone and
once beside one busy-loop process (a pure-Python ``while True``, one core's worth of load),
for every setting given (environment variables, e.g. ``OMP_NUM_THREADS=1``; ``posbench``
alone is the code's own policy). Prints, and writes with ``--out``, wall time, the median
training tokens/s over the logged intervals, and the ratio beside/alone. On 2 cores the busy
process leaves the job one core: a job that slows in proportion to the cores it gets takes at
most about x2 (x1.5 where the job alone used its two threads at 3/4 efficiency, say).

    python scripts/contention.py --jobs default task --settings posbench OMP_NUM_THREADS=1 \
        --out results/bench/contention.md

``--source DIR`` runs another checkout's code (e.g. a git worktree of the commit before a
change) under the label given by ``--label``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The default job, shortened (the full one is 400 steps and a 2048-token ladder): its model, data
# and batch, so its training speed is the default job's.
JOBS = {
    "default": ["encoding=alibi", "train.steps=60", "train.log_every=10", "eval.lengths=[128,256]"],
    "task": ["experiment=tasks_quick", "task=copy", "encoding=nope"],
}


def busy() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def run_job(args: list[str], run_dir: Path, env: dict, source: Path) -> dict:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "posbench.cli", "train", *args, f"hydra.run.dir={run_dir}", "device=cpu"],
                   check=True, env={**env, "PYTHONPATH": str(source)}, cwd=source,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    speeds = [m["tokens_per_s"] for m in metrics if "tokens_per_s" in m][1:]  # the first interval holds start-up
    return {"wall": wall, "tok_s": statistics.median(speeds) if speeds else float("nan")}


def setting_env(setting: str) -> dict:
    env = dict(os.environ)
    for item in setting.split(",") if setting != "posbench" else []:
        key, _, value = item.partition("=")
        env[key] = value
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    parser.add_argument("--settings", nargs="+", default=["posbench"],
                        help="'posbench' (the code's own policy) or VAR=value[,VAR=value] environments")
    parser.add_argument("--source", default=str(ROOT), help="the checkout whose code runs (default: this one)")
    parser.add_argument("--label", default="", help="a name for --source's code in the table")
    parser.add_argument("--out", help="also append the table here (Markdown)")
    ns = parser.parse_args()
    source = Path(ns.source).resolve()
    label = ns.label or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=source, capture_output=True,
                                       text=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run_job(JOBS["task"], tmp / "warm", dict(os.environ), source)  # imports compiled, caches warm
        for job in ns.jobs:
            for setting in ns.settings:
                env = setting_env(setting)
                alone = run_job(JOBS[job], tmp / f"{job}-{len(rows)}-alone", env, source)
                other = busy()
                try:
                    beside = run_job(JOBS[job], tmp / f"{job}-{len(rows)}-beside", env, source)
                finally:
                    other.kill()
                    other.wait()
                rows.append((job, setting, alone, beside))
                print(f"{job} {setting}: alone {alone['wall']:.0f} s, beside {beside['wall']:.0f} s", file=sys.stderr)
    lines = [f"code: {label}; {os.cpu_count()} cores; jobs: " + "; ".join(f"{j} = `posbench train {' '.join(JOBS[j])}`"
                                                                       for j in ns.jobs), "",
             "| job | setting | wall alone s | wall beside s | x wall | tok/s alone | tok/s beside | x tok/s |",
             "|---|---|---|---|---|---|---|---|"]
    for job, setting, a, b in rows:
        lines.append(f"| {job} | {setting} | {a['wall']:.1f} | {b['wall']:.1f} | {b['wall'] / a['wall']:.2f} | "
                     f"{a['tok_s']:.0f} | {b['tok_s']:.0f} | {a['tok_s'] / b['tok_s']:.2f} |")
    table = "\n".join(lines)
    print(table)
    if ns.out:
        with open(ns.out, "a") as f:
            f.write(table + "\n\n")


if __name__ == "__main__":
    main()
