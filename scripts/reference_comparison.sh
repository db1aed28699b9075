#!/usr/bin/env bash
# Regenerates results/cpu_quick/: the default comparison of the ALiBi paper's encodings
# (plus learned and nope) on the default corpus, train_len 128, evaluated at 1x..16x.
# About 6 minutes per encoding on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
encodings=${ENCODINGS:-sinusoidal,learned,rope,t5,alibi,nope}
seeds=${SEEDS:-0}
sweep=outputs/reference_cpu_quick
posbench -m train encoding="$encodings" seed="$seeds" hydra.sweep.dir="$sweep"
posbench report "$sweep" --out results/cpu_quick
