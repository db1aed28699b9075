#!/usr/bin/env bash
# Regenerates results/headline_sliding/: the headline's runs (posbench study headline) evaluated with
# sliding windows (Press et al. 2022, app. B) at 2x..16x their train_len of 128, stride 64, so every
# token past the first window is predicted from L - 64 tokens of context or more; the report then
# sets each of those rows beside the run's own at 128 (## Context, context.csv: KERPLE's control,
# the same tokens with and without the longer context, by their offset in the 128-token window).
# JOBS evaluations run side by side (default 2); each run dir's own, one at a time. Re-running
# skips rows a run already holds.
#   bash scripts/headline_sliding.sh
#   JOBS=15 bash scripts/headline_sliding.sh      # on a GPU machine
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/headline_dirs.sh  # study, sweep, find_headline
find_headline
[ ${#headline[@]} -gt 0 ] || { echo "headline_sliding.sh: no headline runs in $study or $sweep; run posbench study headline first" >&2; exit 2; }
find "${headline[@]}" -name results.csv -path "*seed=*" -printf '%h\n' | sort \
    | xargs -P "${JOBS:-2}" -I{} posbench eval checkpoint={} eval.mode=sliding eval.stride=64 "eval.lengths=[256,512,1024,2048]"
posbench report "${headline[@]}" --out "${RESULTS:-results/headline_sliding}" --log-y
