#!/usr/bin/env bash
# Regenerates results/new_schemes/: the schemes of 2024-2025 at the reference budget
# (experiment=reference: train_len 128, 4,883 steps of 32 windows = 20.0M tokens, warmup-stable-
# decay), reported beside the headline's five (scripts/reference.sh; its runs are read where they
# are): FoX, p-RoPE, the RoPE/NoPE hybrid, stick-breaking attention, DAPE and PoPE as encodings,
# and as model options SSMax (nope, rope), log-n scaling (nope), QK-norm (rope) and a 128-token
# sliding window (rope): scripts/zoo.sh at another budget. Two seeds (SEEDS=0,1,2 for a third);
# JOBS, LAUNCHER and EXTRA as for zoo.sh. Re-running resumes.
#   bash scripts/new_schemes.sh
#   JOBS=15 EXTRA=train.compile=false bash scripts/new_schemes.sh     # on a GPU machine
# or, on a GPU machine with 16 cores, the groups side by side (zoo.sh's ONLY), 16 jobs and then
# the last 6 (720 s on one H100; results/new_schemes/README.md):
#   ONLY=encodings JOBS=12 EXTRA=train.compile=false bash scripts/new_schemes.sh &
#   ONLY=ssmax JOBS=4 EXTRA=train.compile=false bash scripts/new_schemes.sh & wait
#   for g in logn qk_norm window; do ONLY=$g JOBS=2 EXTRA=train.compile=false bash scripts/new_schemes.sh & done
#   wait; bash scripts/new_schemes.sh report
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/headline_dirs.sh  # study, sweep, find_headline
find_headline
# the headline's runs where this machine has them, else as they ship (results/baselines/headline)
EXPERIMENT=reference ENCODINGS=${ENCODINGS:-fox,p_rope,rope_nope,stickbreaking,dape,pope} \
    OUT=${OUT:-outputs/new_schemes} RUNS=${RUNS:-results/new_schemes/runs} RESULTS=${RESULTS:-results/new_schemes} \
    BESIDE="${headline[*]:-results/baselines/headline}" \
    bash scripts/zoo.sh "$@"  # a step (export, report) as zoo.sh takes it
