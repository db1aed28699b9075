#!/usr/bin/env bash
# Regenerates results/zoo/: every registered encoding under experiment=zoo (train_len 128, 488 steps
# of 32 windows = 2.0M tokens, warmup-stable-decay; conf/experiment/zoo.yaml), two seeds, evaluated
# at 128..2048 on the whole validation split; then the model options that are baselines of their
# own, as lines beside them: SSMax (nope, rope) and log-n scaling (nope), QK-norm (rope) and a
# 128-token sliding window (rope). JOBS jobs run side by side (default 2, one torch thread each on 2
# cores; LAUNCHER=basic: one after the other), compiled (EXTRA=... replaces train.compile=true). One
# sweep per group, so each finished group is a finished piece of the table; re-running the same
# command resumes. EXPERIMENT (default zoo), ENCODINGS, OUT, RESULTS and BESIDE (run or sweep dirs
# reported beside these; scripts/new_schemes.sh uses them) make the same comparison elsewhere.
#   bash scripts/zoo.sh                      # SEEDS=0,1,2 for a third seed
#   JOBS=15 EXTRA=train.compile=false bash scripts/zoo.sh     # on a GPU machine
set -euo pipefail
cd "$(dirname "$0")/.."
encodings=${ENCODINGS:-$(posbench encodings | awk 'NR>1 && NF>3 && $1!="(params:" && $1!~/^model/ {print $1}' | paste -sd, -)}
seeds=${SEEDS:-0,1}
out=${OUT:-outputs/zoo}
results=${RESULTS:-results/zoo}
read -ra beside <<< "${BESIDE:-}"
read -ra extra <<< "${EXTRA:-train.compile=true}"
launcher=(hydra/launcher="${LAUNCHER:-local_parallel}" hydra.launcher.n_jobs="${JOBS:-2}")
[ "${LAUNCHER:-}" = basic ] && launcher=()
common=(experiment="${EXPERIMENT:-zoo}" seed="$seeds" "${extra[@]}" "${launcher[@]}")
sub="\${encoding.name}/seed=\${seed}"
posbench -m train "${common[@]}" encoding="$encodings" "hydra.sweep.dir='$out/encodings'" "hydra.sweep.subdir='$sub'"
for option in "nope,rope model.length_scaling=ssmax ssmax" "nope model.length_scaling=logn logn" \
              "rope model.qk_norm=true qk_norm" "rope model.window=128 window"; do
    read -r which setting name <<< "$option"
    posbench -m train "${common[@]}" encoding="$which" "$setting" "hydra.sweep.dir='$out/$name'" "hydra.sweep.subdir='$sub'"
done
posbench report "${beside[@]}" "$out" --by model.length_scaling --by model.qk_norm --by model.window --out "$results" \
    --log-y
python scripts/encoding_table.py "$results/report.csv" > "$results/encodings.md"
