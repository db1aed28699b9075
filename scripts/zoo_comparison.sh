#!/usr/bin/env bash
# Regenerates results/zoo_quick/: every registered encoding under experiment=zoo_quick
# (train_len 64, 250 steps of 32 windows), evaluated at 64..1024 tokens. About 35 minutes on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
encodings=${ENCODINGS:-$(posbench encodings | awk '{print $1}' | paste -sd, -)}
sweep=outputs/zoo_quick
posbench -m train experiment=zoo_quick encoding="$encodings" seed=0 hydra.sweep.dir="$sweep"
posbench report "$sweep" --out results/zoo_quick
