#!/usr/bin/env bash
# Regenerates results/new_schemes/: the schemes of 2024-2025 at the reference budget
# (experiment=reference: train_len 128, 4,883 steps of 32 windows = 20.0M tokens, warmup-stable-
# decay), beside the headline's five (scripts/reference.sh, the same folder, so one report holds
# both): FoX, p-RoPE, the RoPE/NoPE hybrid, stick-breaking attention, DAPE and PoPE as encodings,
# and as model options SSMax (nope, rope), log-n scaling (nope), QK-norm (rope) and a 128-token
# sliding window (rope). Two seeds (SEEDS=0,1,2 for a third). JOBS jobs side by side (default 2,
# one torch thread each on 2 cores; LAUNCHER=basic: one after the other), compiled (EXTRA=...
# replaces train.compile=true). Re-running resumes.
#   bash scripts/new_schemes.sh
#   JOBS=15 EXTRA=train.compile=false bash scripts/new_schemes.sh     # on a GPU machine
set -euo pipefail
cd "$(dirname "$0")/.."
encodings=${ENCODINGS:-fox,p_rope,rope_nope,stickbreaking,dape,pope}
seeds=${SEEDS:-0,1}
sweep=${SWEEP:-outputs/reference}
options=${OPTIONS:-outputs/reference_options}
read -ra extra <<< "${EXTRA:-train.compile=true}"
launcher=(hydra/launcher="${LAUNCHER:-local_parallel}" hydra.launcher.n_jobs="${JOBS:-2}")
[ "${LAUNCHER:-}" = basic ] && launcher=()
common=(experiment=reference seed="$seeds" "${extra[@]}" "${launcher[@]}")
sub="\${encoding.name}/seed=\${seed}"
posbench -m train "${common[@]}" encoding="$encodings" "hydra.sweep.dir='$sweep'" "hydra.sweep.subdir='$sub'"
posbench -m train "${common[@]}" encoding=nope,rope model.length_scaling=ssmax "hydra.sweep.dir='$options/ssmax'" \
    "hydra.sweep.subdir='$sub'"
posbench -m train "${common[@]}" encoding=nope model.length_scaling=logn "hydra.sweep.dir='$options/logn'" \
    "hydra.sweep.subdir='$sub'"
posbench -m train "${common[@]}" encoding=rope model.qk_norm=true "hydra.sweep.dir='$options/qk_norm'" \
    "hydra.sweep.subdir='$sub'"
posbench -m train "${common[@]}" encoding=rope model.window=128 "hydra.sweep.dir='$options/window'" \
    "hydra.sweep.subdir='$sub'"
steps=$(python -c "from omegaconf import OmegaConf; print(OmegaConf.load('conf/experiment/reference.yaml').train.steps)")
study=${STUDY:-outputs/budget_study/default}/steps=$steps
dirs=()
for d in "$study" "$sweep" "$options"; do [ -d "$d" ] && dirs+=("$d"); done
posbench report "${dirs[@]}" --by model.length_scaling --by model.qk_norm --by model.window \
    --out "${RESULTS:-results/new_schemes}" --log-y
python scripts/encoding_table.py "${RESULTS:-results/new_schemes}/report.csv" > "${RESULTS:-results/new_schemes}/encodings.md"
