#!/usr/bin/env bash
# Regenerates results/zoo/: every registered encoding under experiment=zoo (train_len 128, 488 steps
# of 32 windows = 2.0M tokens, warmup-stable-decay; conf/experiment/zoo.yaml), two seeds, evaluated
# at 128..2048 on the whole validation split; then the model options that are baselines of their
# own, as lines beside them: SSMax (nope, rope) and log-n scaling (nope), QK-norm (rope) and a
# 128-token sliding window (rope). JOBS jobs run side by side (default 2, one torch thread each on 2
# cores; LAUNCHER=basic: one after the other), compiled (EXTRA=... replaces train.compile=true).
#
# The study takes longer than a working day on 2 cores, so it is kept run by run: each finished
# run under OUT/<group>/<encoding>/seed=N is exported within a minute to
# RUNS/<group>/<encoding>/seed=N (results, config and per-block NLL sums, a few KiB: what the
# report needs; `posbench report --export-baseline`), small enough to commit as it comes. A run
# whose export exists is not trained again, so the same command resumes the study on a machine
# that kept neither outputs/ nor the unfinished runs. The report is drawn from RUNS, which ships
# as `posbench report MY_RUNS --baseline zoo --by model.length_scaling,model.qk_norm,model.window`.
#   bash scripts/zoo.sh                      # SEEDS=0,1,2 for a third seed
#   bash scripts/zoo.sh export               # export the finished runs now, and stop
#   bash scripts/zoo.sh report               # the report of the runs exported so far, and stop
#   JOBS=15 EXTRA=train.compile=false bash scripts/zoo.sh     # on a GPU machine
# EXPERIMENT (default zoo), ENCODINGS, OUT, RUNS, RESULTS and BESIDE (run or sweep dirs reported
# beside these; scripts/new_schemes.sh uses them) make the same comparison elsewhere. ONLY
# (default all: encodings,ssmax,logn,qk_norm,window) trains only those groups, so that several
# zoo.sh processes can train the groups side by side on a machine with cores to spare:
#   ONLY=encodings JOBS=10 bash scripts/zoo.sh & ONLY=ssmax,logn,qk_norm,window JOBS=4 bash scripts/zoo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
encodings=${ENCODINGS:-$(posbench encodings | awk 'NR>1 && NF>3 && $1!="(params:" && $1!~/^model/ {print $1}' | paste -sd, -)}
seeds=${SEEDS:-0,1}
out=${OUT:-outputs/zoo}
runs=${RUNS:-results/baselines/zoo}
results=${RESULTS:-results/zoo}
read -ra beside <<< "${BESIDE:-}"
read -ra extra <<< "${EXTRA:-train.compile=true}"
launcher=(hydra/launcher="${LAUNCHER:-local_parallel}" hydra.launcher.n_jobs="${JOBS:-2}")
[ "${LAUNCHER:-}" = basic ] && launcher=()
common=(experiment="${EXPERIMENT:-zoo}" seed="$seeds" "${extra[@]}" "${launcher[@]}")
sub="\${encoding.name}/seed=\${seed}"
# group, then the encodings it trains and the model option that sets it apart
groups=("encodings $encodings" "ssmax nope,rope model.length_scaling=ssmax" "logn nope model.length_scaling=logn"
        "qk_norm rope model.qk_norm=true" "window rope model.window=128")
names=$(for group in "${groups[@]}"; do echo "${group%% *}"; done | paste -sd, -)
selected=${ONLY:-$names}
chosen() { [[ ",$selected," == *",$1,"* ]]; }  # group -> whether ONLY trains it
for name in ${selected//,/ }; do
    if [[ ",$names," != *",$name,"* ]]; then
        echo "zoo.sh: unknown group ONLY=$selected ('$name'); valid: $names" >&2
        exit 2
    fi
done

export_finished() {  # a finished run (its ppl_vs_length.png is drawn last) without an export gets one
    local plot run rel tmp
    for plot in "$out"/*/*/seed=*/ppl_vs_length.png; do
        [ -e "$plot" ] || continue
        run=${plot%/ppl_vs_length.png}
        rel=${run#"$out"/}
        chosen "${rel%%/*}" || continue  # another zoo.sh exports its own groups
        [ -e "$runs/$rel/blocks.npz" ] && continue
        tmp=$(mktemp -d)
        if posbench report "$run" --export-baseline "$tmp" > /dev/null; then
            mkdir -p "$runs/${rel%/*}" && rm -rf "${runs:?}/$rel" && mv "$tmp"/*/"${run##*/}" "$runs/$rel"
            echo "exported $run to $runs/$rel"
        fi
        rm -rf "$tmp"
    done
}

to_train() {  # group, encodings -> those of the encodings with a seed whose run has no export
    local group=$1 enc seed which=()
    for enc in ${2//,/ }; do
        for seed in ${seeds//,/ }; do
            [ -e "$runs/$group/$enc/seed=$seed/blocks.npz" ] || { which+=("$enc"); break; }
        done
    done
    (IFS=,; echo "${which[*]}")
}

draw_report() {
    posbench report "${beside[@]}" "$runs" --by model.length_scaling --by model.qk_norm --by model.window \
        --out "$results" --log-y
    python scripts/encoding_table.py "$results/report.csv" > "$results/encodings.md"
}

case "${1:-}" in
    export) export_finished; exit ;;
    report) draw_report; exit ;;
    "") ;;
    *) echo "zoo.sh: unknown step '$1'; valid: export, report, or none (the whole study)" >&2; exit 2 ;;
esac
(while sleep 60; do export_finished; done) &
exporter=$!
trap 'kill $exporter 2> /dev/null || true' EXIT
for group in "${groups[@]}"; do
    read -r name which setting <<< "$group"
    chosen "$name" || continue
    which=$(to_train "$name" "$which")
    if [ -z "$which" ]; then
        echo "$name: every run is exported to $runs/$name"
        continue
    fi
    posbench -m train "${common[@]}" encoding="$which" ${setting:+"$setting"} "hydra.sweep.dir='$out/$name'" \
        "hydra.sweep.subdir='$sub'"
    export_finished
done
draw_report
