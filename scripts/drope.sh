#!/usr/bin/env bash
# Regenerates results/drope/: DroPE (Gelberg et al. 2025) at the zoo_quick budget. The parents are
# the three rope runs of scripts/baseline_zoo_quick.sh (train_len 64, 250 steps); each is
# recalibrated without RoPE (encoding=nope, and nope with QK-norm: the reference's nope and
# qk_norm_nope) at the same length for 25 steps (10% of the parent's budget) at the parent's
# peak learning rate held constant (the reference's schedule). Beside them, the parents (rope)
# and nope trained from scratch for 250 steps, from the same sweep; all evaluated at 1x..16x on
# the same 16,384 tokens. Re-running resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
parents=${PARENTS:-outputs/baseline_zoo_quick}
out=outputs/drope
steps=${STEPS:-25}
for seed in 0 1 2; do
    parent="$parents/rope/experiment=zoo_quick,seed=$seed"
    [ -f "$parent/checkpoints/last.pt" ] || { echo "drope.sh: no finished run at $parent (run scripts/baseline_zoo_quick.sh)" >&2; exit 2; }
    common=(experiment=zoo_quick seed=$seed train.init_from="$parent" train.schedule=constant train.steps=$steps
            train.warmup_steps=0 encoding=nope)
    posbench train "${common[@]}" hydra.run.dir="$out/drope/seed=$seed"
    posbench train "${common[@]}" model.qk_norm=true hydra.run.dir="$out/drope_qk_norm/seed=$seed"
done
posbench report "$out/drope" "$out/drope_qk_norm" "$parents/rope" "$parents/nope" --by train.init_from \
    --out results/drope --log-y
