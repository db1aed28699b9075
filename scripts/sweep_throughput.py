"""Sweep throughput on this machine: the same small sweep under each way of running it.

A sweep of J jobs (alibi and rope by default, seeds 0..J/2-1) at the default shape, each job
``--steps`` training steps and a one-length evaluation, is run in fresh sweep dirs under
``outputs/sweep_throughput/``, one setting after the other:

* ``sequential``: Hydra's basic launcher, one job at a time, torch on every core;
* ``side by side``: ``hydra/launcher=local_parallel`` with n_jobs = cores, one torch thread each;
* with ``--batch``: the sequential setting again at other ``train.batch_size`` values, the learning
  rate scaled by the square root of the batch ratio (the AdamW rule of Malladi et al. 2022),
  reported in training tokens/s (a different batch is a different run, not the same sweep).

Each setting's figure is the wall time of the whole ``posbench -m train`` command (start-up,
corpus load, training, evaluation, files) and the training tokens it did per second of wall time;
the ratios are against ``sequential`` measured in the same run. A short run first builds the
corpus cache every setting then shares.

    python scripts/sweep_throughput.py [--steps 40] [--jobs 4] [--out results/bench/sweep_throughput.md]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE_BATCH, BASE_LR, TRAIN_LEN = 32, 1e-3, 128


def sweep(out: Path, steps: int, jobs: int, *extra: str) -> float:
    """Run one ``posbench -m train`` sweep into ``out`` -> wall seconds."""
    shutil.rmtree(out, ignore_errors=True)
    seeds = ",".join(str(s) for s in range(max(1, jobs // 2)))
    cmd = [sys.executable, "-m", "posbench.cli", "-m", "train", f"seed={seeds}", "encoding=alibi,rope",
           f"train.steps={steps}", f"train.warmup_steps={max(1, steps // 10)}", f"train.ckpt_every={steps}",
           f"eval.lengths=[{TRAIN_LEN}]", f"eval.max_tokens={4 * TRAIN_LEN}", f"hydra.sweep.dir={out}", *extra]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps per job")
    parser.add_argument("--jobs", type=int, default=4, help="jobs per sweep (alibi and rope x jobs/2 seeds)")
    parser.add_argument("--batch", type=int, nargs="*", default=[], help="other train.batch_size values to time")
    parser.add_argument("--out", help="also write the table here (Markdown)")
    ns = parser.parse_args()
    cores = os.cpu_count() or 1
    base = ROOT / "outputs" / "sweep_throughput"
    sweep(base / "warmup", 2, 2)  # builds the corpus cache the settings share
    settings = [("sequential", BASE_BATCH, ()),
                (f"side by side ({cores} jobs x 1 thread)", BASE_BATCH,
                 ("hydra/launcher=local_parallel", f"hydra.launcher.n_jobs={cores}"))]
    settings += [(f"sequential, batch {b}, lr x {(b / BASE_BATCH) ** 0.5:.2f}", b,
                  (f"train.batch_size={b}", f"train.lr={BASE_LR * (b / BASE_BATCH) ** 0.5:g}")) for b in ns.batch]
    rows = []
    for i, (name, batch, extra) in enumerate(settings):
        seconds = sweep(base / f"setting{i}", ns.steps, ns.jobs, *extra)
        tokens = ns.jobs * ns.steps * batch * TRAIN_LEN
        rows.append((name, seconds, tokens / seconds))
        print(f"{name:<45} {seconds:7.1f} s  {tokens / seconds:8,.0f} training tok/s", flush=True)
    first = rows[0][2]
    lines = [f"Sweep of {ns.jobs} jobs (alibi, rope; {ns.steps} steps of {{batch}} x {TRAIN_LEN} tokens each, "
             f"evaluation at {TRAIN_LEN}), {cores} cores, one setting after the other:", "",
             "| setting | wall s | training tok/s | vs sequential |", "|---|---|---|---|"]
    lines += [f"| {name} | {s:.1f} | {tps:,.0f} | {tps / first:.2f}x |" for name, s, tps in rows]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if ns.out:
        Path(ns.out).write_text(text)


if __name__ == "__main__":
    main()
