#!/usr/bin/env bash
# Regenerates results/zoo_quick/: every registered encoding under experiment=zoo_quick
# (train_len 64, 250 steps of 32 windows), evaluated at 64..1024 tokens, two seeds. Jobs run
# side by side, one torch thread each (LAUNCHER=basic: one after the other); re-running resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
encodings=${ENCODINGS:-$(posbench encodings | awk 'NR>1 && NF>3 && $1!="(params:" {print $1}' | paste -sd, -)}
seeds=${SEEDS:-0,1}
sweep=outputs/zoo_quick
launcher=(hydra/launcher="${LAUNCHER:-local_parallel}")
[ "${LAUNCHER:-}" = basic ] && launcher=()
posbench -m train experiment=zoo_quick encoding="$encodings" seed="$seeds" "${launcher[@]}" hydra.sweep.dir="$sweep"
posbench report "$sweep" --out results/zoo_quick --log-y
