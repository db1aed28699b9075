#!/usr/bin/env bash
# Regenerates results/rope_scaling/: every RoPE scaling applied at inference (no retraining) to
# the three rope runs of scripts/reference_comparison.sh (train_len 128), with the factor
# s = eval_len / train_len at each length. The runs are copied first, so the scaled rows do not
# land in the reference runs' results.csv; re-running skips rows already evaluated.
set -euo pipefail
cd "$(dirname "$0")/.."
reference=${REFERENCE:-outputs/reference_cpu_quick}
out=outputs/rope_scaling
runs=()
for seed in 0 1 2; do
    src="$reference/rope/seed=$seed" dst="$out/seed$seed"
    [ -f "$src/checkpoints/last.pt" ] || { echo "rope_scaling.sh: no finished run at $src (run scripts/reference_comparison.sh first)" >&2; exit 2; }
    [ -d "$dst" ] || { mkdir -p "$out" && cp -r "$src" "$dst.tmp" && rm -f "$dst.tmp/.posbench.lock" && mv "$dst.tmp" "$dst"; }
    runs+=("$dst")
done
posbench -m eval checkpoint="$(IFS=,; echo "${runs[*]}")" eval.rope_scaling=none,pi,ntk,dynamic_ntk,yarn \
    hydra.sweep.dir=outputs/rope_scaling_sweep
posbench report "$out" --out results/rope_scaling --log-y
