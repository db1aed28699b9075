"""How fast a CPU sweep runs its jobs: one after the other with every core each, or side by side.

Runs the same short sweep (ENCODINGS x 1 seed, --steps training steps, a small evaluation) once
per setting, in fresh sweep dirs under outputs/sweep_throughput/, after one short run has built
the corpus cache they share, and prints per setting: the sweep's wall time, the summed training
tokens/s of its jobs (median over each job's logged intervals, summed over the jobs that ran
at the same time) and the ratio to the first setting. Same machine, same run, one after the
other, so the ratios compare like with like; absolute figures differ between machines.

    python scripts/sweep_throughput.py [--steps 30] [--out results/bench/sweep_throughput.md]
    python scripts/sweep_throughput.py --default-job --settings basic "local_parallel + compile"

`--default-job` runs the default job itself (its 400 steps and its whole-split evaluation) instead
of a short one, and prints beside each setting the wall time of the default comparison's sweep
(6 encodings x 3 seeds = 18 jobs, `posbench study cpu_quick`) that it implies: the measured
sweep's wall time x 9, as the two jobs here (alibi and rope) stand for a pair of its jobs.

Settings: `basic` (Hydra's sequential launcher, each job with all cores' torch threads),
`local_parallel` with n_jobs = 2 (each job with cores / 2 threads, see posbench.cli.hydra_apps._use_threads),
and local_parallel with `train.compile=true` or with twice the batch (tokens/s per window of work).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENCODINGS = "alibi,rope"
PAIRS = 18 // 2  # the default comparison's 6 encodings x 3 seeds, two jobs at a time
PARALLEL = ["hydra/launcher=local_parallel", "hydra.launcher.n_jobs=2"]
SETTINGS = {
    "basic": [],
    "local_parallel": PARALLEL,
    # the same sweep with the model under torch.compile (inductor; its compile time is in the wall time)
    "local_parallel + compile": PARALLEL + ["train.compile=true"],
    # twice the windows per step: tokens/s only (whether a run with half the steps learns as much
    # is a question of the learning rate, not of speed)
    "local_parallel, batch 64": PARALLEL + ["train.batch_size=64"],
}


def sweep(name: str, steps: int | None, out: Path) -> dict:
    """One sweep of ENCODINGS x seed 0 under a setting; ``steps`` None: the default job as it is."""
    sweep_dir = out / name.replace(" + ", "_").replace(", ", "_").replace(" ", "")
    shutil.rmtree(sweep_dir, ignore_errors=True)
    short = [] if steps is None else [f"train.steps={steps}", "train.warmup_steps=5", "train.log_every=5",
                                      f"train.ckpt_every={steps}", "eval.multiples=[1]", "eval.max_tokens=4096"]
    cmd = [sys.executable, "-m", "posbench.cli", "-m", "train", f"encoding={ENCODINGS}", "seed=0", *short,
           f"hydra.sweep.dir={sweep_dir}", *SETTINGS[name]]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    rates = []
    for metrics in sorted(sweep_dir.glob("*/*/metrics.jsonl")):
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        rates.append(statistics.median(r["tokens_per_s"] for r in rows[1:] if "tokens_per_s" in r))
    side_by_side = name != "basic"
    return {"setting": name, "jobs": len(rates), "wall_s": wall,
            "train_tok_s": sum(rates) if side_by_side else statistics.mean(rates)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps per job")
    parser.add_argument("--default-job", action="store_true",
                        help="run the default job (400 steps, whole-split evaluation) and project the 18-job sweep")
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS), metavar="SETTING",
                        help=f"which settings, in order (default: all; valid: {', '.join(map(repr, SETTINGS))})")
    parser.add_argument("--out", help="also write the table here (Markdown)")
    args = parser.parse_args()
    steps = None if args.default_job else args.steps
    out = ROOT / "outputs" / "sweep_throughput"
    # warm the corpus cache so no setting pays for building it
    subprocess.run([sys.executable, "-m", "posbench.cli", "train", "train.steps=1", "eval.multiples=[1]",
                    "eval.max_tokens=1024", f"hydra.run.dir={out / 'warm'}"], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [sweep(name, steps, out) for name in args.settings]
    cores = os.cpu_count()
    what = "the default job (400 steps, whole-split evaluation)" if steps is None else f"{steps} steps each"
    command = " ".join(["python scripts/sweep_throughput.py",
                        "--default-job" if steps is None else f"--steps {steps}",
                        *(["--settings", *(repr(n) if " " in n else n for n in args.settings)]
                          if args.settings != list(SETTINGS) else [])])
    lines = [f"Sweep throughput: encoding={ENCODINGS} seed=0, {what}, {cores} cores, `{command}`", "",
             f"| setting | jobs | sweep wall s | training tok/s (summed over concurrent jobs) | vs {args.settings[0]} |"
             + (f" 18-job sweep, min (x {PAIRS}) |" if steps is None else ""),
             "|---|---|---|---|---|" + ("---|" if steps is None else "")]
    base = rows[0]
    for r in rows:
        lines.append(f"| {r['setting']} | {r['jobs']} | {r['wall_s']:.0f} | {r['train_tok_s']:.0f} | "
                     f"{r['train_tok_s'] / base['train_tok_s']:.2f}x tok/s, {base['wall_s'] / r['wall_s']:.2f}x wall |"
                     + (f" {PAIRS * r['wall_s'] / 60:.0f} |" if steps is None else ""))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
