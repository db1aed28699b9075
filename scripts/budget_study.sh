#!/usr/bin/env bash
# Regenerates results/budget_study/: how the comparison changes with the training budget.
# sinusoidal, rope, t5 (both parameterisations), alibi and nope, two seeds, the default model
# and data (train_len 128, 32 windows = 4,096 tokens a step), at four budgets:
#   122 steps (0.5M tokens), 488 (2.0M), 1221 (5.0M), 4883 (20.0M)
# under warmup-stable-decay (train.schedule=wsd: 40 warmup steps, the peak lr held, the last 20%
# of the steps cooled down), so every budget is a finished run with its own decay, not a
# snapshot of a longer one. The 20M-token run of each (encoding, seed) keeps its checkpoints at
# the shorter budgets' decay starts (train.save_steps) and each shorter budget branches off it
# (train.branch_from), which gives the numbers a run from scratch gives (tests/test_branch.py)
# for the cost of its decay: 5,249 steps per (encoding, seed) instead of 6,714.
# One line at a time: its seeds' longest runs side by side (one torch thread each; LAUNCHER=basic:
# one after the other), then its branches, so every finished line is a finished piece of the
# table (scripts/budget_table.py reads whatever lines are done). Training is compiled
# (train.compile=true, not part of the config hash: about 1.12x the tokens/s of eager jobs side
# by side, results/bench/sweep_throughput.md). Re-running the same command resumes an
# interrupted study.
set -euo pipefail
cd "$(dirname "$0")/.."
encodings=${ENCODINGS:-alibi rope nope t5 sinusoidal t5_unscaled}  # t5_unscaled: T5 with bias_scale=none
seeds=${SEEDS:-0,1}
out=${OUT:-outputs/budget_study}
read -ra budgets <<< "${BUDGETS:-4883 1221 488 122}"  # longest first: the others branch off it
read -ra extra <<< "${EXTRA:-train.compile=true}"  # overrides for every run (EXTRA="experiment=smoke" for a quick eager check)
launcher=(hydra/launcher="${LAUNCHER:-local_parallel}")
[ "${LAUNCHER:-}" = basic ] && launcher=()
longest=${budgets[0]}
warmup=${WARMUP:-40}
keep=$(python -c "from posbench.config import TrainConfig as T; import sys; w = int(sys.argv[1]); \
print(','.join(str(T(steps=int(s), warmup_steps=w, schedule='wsd', decay_frac=0.2).decay_start()) for s in sys.argv[2:]))" \
    "$warmup" "${budgets[@]:1}")  # the shorter budgets' decay starts: 977, 390, 98
study() {  # $1: the line's dir under $out; the rest: its overrides
    local line=$1; shift
    local common=(seed="$seeds" train.schedule=wsd train.decay_frac=0.2 train.warmup_steps="$warmup" "${extra[@]}"
                  "${launcher[@]}"
                  "hydra.sweep.subdir='\${encoding.name}/seed=\${seed}'")  # values with '=' are quoted for Hydra
    posbench -m train "$@" "${common[@]}" train.steps="$longest" "train.save_steps=[$keep]" \
        "hydra.sweep.dir='$out/$line/steps=$longest'"
    for steps in "${budgets[@]:1}"; do
        posbench -m train "$@" "${common[@]}" train.steps="$steps" \
            "train.branch_from='$out/$line/steps=$longest/\${encoding.name}/seed=\${seed}'" \
            "hydra.sweep.dir='$out/$line/steps=$steps'"
    done
}
for enc in $encodings; do
    if [ "$enc" = t5_unscaled ]; then study t5_unscaled encoding=t5 encoding.bias_scale=none
    else study default encoding="$enc"; fi
done
python scripts/budget_table.py "$out" --out "${RESULTS:-results/budget_study}"
