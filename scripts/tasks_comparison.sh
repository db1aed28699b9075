#!/usr/bin/env bash
# Regenerates results/tasks_quick/: the ALiBi paper's four encodings and nope, plus rope and
# sinusoidal with randomized positions (Ruoss et al. 2023, L = 256), on four algorithmic tasks
# (copy, reverse, sort, duplicate) under experiment=tasks_quick (sizes 1..8 in training, accuracy
# at sizes 8..64), three seeds.
# Seeds come first, so an interrupted sweep has whole seeds done; re-running the same command
# resumes it (finished runs evaluate again).
# Jobs run side by side, one torch thread each (LAUNCHER=basic runs them one after the other).
set -euo pipefail
cd "$(dirname "$0")/.."
tasks=${TASKS:-copy,reverse,sort,duplicate}
seeds=${SEEDS:-0,1,2}
sweep=${SWEEP:-outputs/tasks_quick}
launcher=(hydra/launcher="${LAUNCHER:-local_parallel}")
[ "${LAUNCHER:-}" = basic ] && launcher=()
for seed in ${seeds//,/ }; do
    posbench -m train experiment=tasks_quick seed="$seed" task="$tasks" encoding=sinusoidal,rope,t5,alibi,nope \
        "${launcher[@]}" hydra.sweep.dir="$sweep"
    posbench -m train experiment=tasks_quick seed="$seed" task="$tasks" encoding=sinusoidal,rope \
        train.random_positions=256 "${launcher[@]}" hydra.sweep.dir="$sweep"
done
posbench report "$sweep" --out results/tasks_quick
