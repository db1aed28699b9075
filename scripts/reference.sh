#!/usr/bin/env bash
# Regenerates results/headline/: README's headline comparison, `experiment=reference` (the default
# model and data at the budget the budget study picked, conf/experiment/reference.yaml) with
# sinusoidal, rope, t5, alibi and nope, three seeds, evaluated at 1x..16x on the whole validation split.
#
# The budget study's runs at that budget (outputs/budget_study/default/steps=<steps>) have the same
# config hash as the preset's (branching, kept checkpoints and compile are not part of it), so an
# (encoding, seed) the study has finished is not trained again: it is read from there, and only the
# others are trained here, into outputs/reference. JOBS jobs run side by side (default 2, one torch
# thread each on 2 cores; LAUNCHER=basic: one after the other), compiled (EXTRA=... replaces
# train.compile=true). Re-running the same command resumes. On a GPU machine the 15 jobs fit at once:
#   JOBS=15 EXTRA=train.compile=false bash scripts/reference.sh
set -euo pipefail
cd "$(dirname "$0")/.."
encodings=${ENCODINGS:-sinusoidal,rope,t5,alibi,nope}
seeds=${SEEDS:-0,1,2}
read -ra extra <<< "${EXTRA:-train.compile=true}"
launcher=(hydra/launcher="${LAUNCHER:-local_parallel}" hydra.launcher.n_jobs="${JOBS:-2}")
[ "${LAUNCHER:-}" = basic ] && launcher=()
source scripts/headline_dirs.sh  # study, sweep, find_headline

declare -A todo  # missing seeds ("2" or "0,2") -> the encodings that miss exactly those
for enc in ${encodings//,/ }; do
    missing=""
    for seed in ${seeds//,/ }; do
        [ -f "$study/$enc/seed=$seed/results.csv" ] || missing+="${missing:+,}$seed"
    done
    [ -n "$missing" ] && todo[$missing]+="${todo[$missing]:+,}$enc"
done
for missing in "${!todo[@]}"; do
    posbench -m train experiment=reference encoding="${todo[$missing]}" seed="$missing" "${extra[@]}" \
        "${launcher[@]}" "hydra.sweep.dir='$sweep'" "hydra.sweep.subdir='\${encoding.name}/seed=\${seed}'"
done
find_headline
posbench report "${headline[@]}" --out "${RESULTS:-results/headline}" --log-y
