#!/usr/bin/env bash
# Regenerates results/baselines/zoo_quick/: the headline's five encodings under
# experiment=zoo_quick (train_len 64, 250 steps of 32 windows, 512k tokens), three seeds, kept as
# results, config and per-block NLL sums, what `posbench report YOUR_RUNS --baseline zoo_quick`
# pairs with. Jobs run side by side (LAUNCHER=basic: one after the other); re-running resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
sweep=outputs/baseline_zoo_quick
launcher=(hydra/launcher="${LAUNCHER:-local_parallel}")
[ "${LAUNCHER:-}" = basic ] && launcher=()
posbench -m train experiment=zoo_quick encoding=alibi,rope,t5,sinusoidal,nope seed=0,1,2 "${launcher[@]}" \
  hydra.sweep.dir="$sweep"
rm -rf results/baselines/zoo_quick
posbench report "$sweep" --export-baseline results/baselines/zoo_quick
posbench report results/baselines/zoo_quick --out results/baselines/zoo_quick/report --log-y
