#!/usr/bin/env bash
# Regenerates results/cpu_quick/: the default comparison of the ALiBi paper's encodings (plus
# learned and nope) on the default corpus, train_len 128, evaluated at 1x..16x on the whole
# validation split, three seeds. Seeds come first in the sweep, so an interrupted sweep has
# whole seeds done; re-running the same command resumes it (finished jobs load their last
# checkpoint and evaluate again). Jobs run side by side, one torch thread each
# (LAUNCHER=basic: one after the other).
set -euo pipefail
cd "$(dirname "$0")/.."
encodings=${ENCODINGS:-sinusoidal,learned,rope,t5,alibi,nope}
seeds=${SEEDS:-0,1,2}
sweep=${SWEEP:-outputs/reference_cpu_quick}
launcher=(hydra/launcher="${LAUNCHER:-local_parallel}")  # 1.29-1.49x the tokens/s of one job at a time
[ "${LAUNCHER:-}" = basic ] && launcher=()                    # on 2 CPU cores (results/bench/sweep_throughput.md)
posbench -m train seed="$seeds" encoding="$encodings" "${launcher[@]}" hydra.sweep.dir="$sweep"
posbench report "$sweep" --out results/cpu_quick --log-y
