#!/usr/bin/env bash
# Regenerates results/drope/: DroPE (Gelberg et al. 2025) at the zoo_quick budget. The parents are
# the three rope runs of scripts/baseline_zoo_quick.sh (train_len 64, 250 steps, peak lr 1e-3
# cosine to 1e-4); each is recalibrated without RoPE (encoding=nope, and nope with QK-norm: the
# reference's nope and qk_norm_nope) at the same length for 25 and for 100 steps (10% and 40% of
# the parent's budget) at a constant 3e-4 after 5 warmup steps (the reference recalibrates its
# SmolLM models at a constant 3e-4). Beside them the parents (rope) and nope trained from scratch
# for 250 steps, from the same sweep; every run evaluated at 1x..16x on the same 16,384 tokens.
# Re-running resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
parents=${PARENTS:-outputs/baseline_zoo_quick}
out=outputs/drope
for seed in 0 1 2; do
    parent="$parents/rope/experiment=zoo_quick,seed=$seed"
    [ -f "$parent/checkpoints/last.pt" ] || { echo "drope.sh: no finished run at $parent (run scripts/baseline_zoo_quick.sh)" >&2; exit 2; }
    for steps in 25 100; do
        common=(experiment=zoo_quick seed=$seed encoding=nope train.init_from="$parent" train.schedule=constant
                train.lr=3e-4 train.warmup_steps=5 train.steps=$steps)
        posbench train "${common[@]}" hydra.run.dir="$out/drope$steps/seed=$seed"
        posbench train "${common[@]}" model.qk_norm=true hydra.run.dir="$out/drope${steps}_qk_norm/seed=$seed"
    done
done
posbench report "$out" "$parents/rope" "$parents/nope" --by train.steps --by model.qk_norm \
    --out results/drope --log-y
