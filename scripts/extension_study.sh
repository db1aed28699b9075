#!/usr/bin/env bash
# Regenerates results/extension/: how cheaply a rope model trained short is extended by a little
# training at a longer length, against training-free scaling and against training long from the
# start with the same compute.
#
# Parents: the headline's rope runs (experiment=reference: train_len 128, 4,883 steps of 32
# windows = 20.0M tokens, warmup-stable-decay to lr 1e-4), trained here where outputs/reference
# does not hold them (the same preset and folder as posbench study headline, so the two share them),
# and the headline's alibi runs beside them, unextended.
#
# Extension by fine-tuning (Chen et al. 2023, PI; Peng et al. 2023, YaRN): each parent continues at
# train_len 512 (4x) for 100 and for 400 steps of 32 windows (1.6M and 6.6M tokens) under
# encoding.trained_scaling none (plain continued training), pi, ntk and yarn, at a fixed factor
# s = 4 relative to the parent's 128 (encoding.trained_factor=4 encoding.original_len=128; YaRN's
# ramp reads 128). PI's schedule: a short warmup (10 steps), then a constant small rate, here
# 1e-4, the rate the parent ended at (PI: 2e-5 against LLaMA's 3e-4 peak).
#
# Training-free scalings of the parents at evaluation: pi, ntk, dynamic_ntk and yarn (s = L / 128
# at each length L), and Self-Extend (W = 64, G = 4) and ReRoPE (W = 64).
#
# Compute-matched baseline: rope trained from scratch at train_len 512 for the FLOPs of the parent
# plus the 400-step extension (train FLOPs per token 6 N + 6 n_layers d_model T, so a 512-token
# window costs a little more per token than a 128-token one), under the same warmup-stable-decay;
# its run keeps its checkpoint at the 100-step extension's matching decay start and the shorter
# baseline branches off it (train.branch_from, as scripts/budget_study.sh does).
#
# Every run is evaluated at 128 .. 2048 (1x..16x of 128, 1x..4x of 512) on the whole validation
# split, then the probes (passkey at 128 .. 2048, variable tracking at 256 .. 2048). JOBS commands
# run side by side (default 2, one per core; the commands on one run dir one after the other).
# Re-running resumes.
#   bash scripts/extension_study.sh         # SEEDS="0 1 2" for a third seed
#   JOBS=15 EXTRA=train.compile=false bash scripts/extension_study.sh     # on a GPU machine
set -euo pipefail
cd "$(dirname "$0")/.."
read -ra seeds <<< "${SEEDS:-0 1}"
parents=${PARENTS:-outputs/reference}
out=${OUT:-outputs/extension}
read -ra extra <<< "${EXTRA:-train.compile=true}"
jobs=${JOBS:-2}
launcher=(hydra/launcher="${LAUNCHER:-local_parallel}" hydra.launcher.n_jobs="$jobs")
[ "${LAUNCHER:-}" = basic ] && launcher=()
# spawn CMD...: run CMD in the background once fewer than $jobs run; drain: wait for all, and stop
# the script if any failed (each failure's own output names it)
failed=$(mktemp -u)
spawn() {
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    { "$@" || touch "$failed"; } &
}
drain() {
    wait
    if [ -e "$failed" ]; then rm -f "$failed"; echo "extension_study.sh: a command failed (its output is above)" >&2; exit 1; fi
}
lengths="[128,256,512,1024,2048]"
long=512
short_steps=100 long_steps=400
seed_list=$(IFS=,; echo "${seeds[*]}")

# 1. parents (rope) and alibi, at the reference budget
posbench -m train experiment=reference encoding=rope,alibi seed="$seed_list" "${extra[@]}" "${launcher[@]}" \
    "hydra.sweep.dir='$parents'" "hydra.sweep.subdir='\${encoding.name}/seed=\${seed}'"

# 2. the compute-matched baseline: rope from scratch at 512 for the parent's + the extension's FLOPs
read -r match_long match_short keep <<< "$(python - "$long" "$long_steps" "$short_steps" <<'EOF'
import math, sys
from omegaconf import OmegaConf
from posbench.config import TrainConfig
ref = OmegaConf.load("conf/experiment/reference.yaml").train
model = OmegaConf.load("conf/model/tiny.yaml")
vocab = OmegaConf.load("conf/data/sotu.yaml").vocab_size
long, ext_long, ext_short = map(int, sys.argv[1:])
d, layers, ff = model.d_model, model.n_layers, model.d_ff
per_token = lambda T: 6 * (layers * (4 * d * d + 2 * d * ff) + vocab * d) + 6 * layers * d * T
parent = ref.steps * ref.batch_size * ref.train_len * per_token(ref.train_len)
step = ref.batch_size * long * per_token(long)
steps = [math.ceil((parent + ext * step) / step) for ext in (ext_long, ext_short)]
start = TrainConfig(steps=steps[1], warmup_steps=ref.warmup_steps, schedule="wsd", decay_frac=0.2).decay_start()
print(steps[0], steps[1], start)
EOF
)"
common=(experiment=reference encoding=rope train.train_len=$long "eval.lengths=$lengths" "${extra[@]}"
        "${launcher[@]}" "hydra.sweep.subdir='seed=\${seed}'")
baseline() {  # the long one first: the short one branches off its kept checkpoint
    posbench -m train "${common[@]}" seed="$seed_list" train.steps="$match_long" "train.save_steps=[$keep]" \
        "hydra.sweep.dir='$out/baseline/steps=$match_long'" || return
    posbench -m train "${common[@]}" seed="$seed_list" train.steps="$match_short" \
        "train.branch_from='$out/baseline/steps=$match_long/seed=\${seed}'" "hydra.sweep.dir='$out/baseline/steps=$match_short'"
}
spawn baseline  # beside the fine-tunes: it reads no parent


# 3. extension by fine-tuning
for seed in "${seeds[@]}"; do
    parent="$parents/rope/seed=$seed"
    for scaling in none pi ntk yarn; do
        for steps in $short_steps $long_steps; do
            args=(experiment=reference seed="$seed" encoding=rope train.init_from="$parent" train.train_len=$long
                  train.steps=$steps train.schedule=constant train.lr=1e-4 train.warmup_steps=10 "eval.lengths=$lengths")
            [ "$scaling" = none ] || args+=(encoding.trained_scaling=$scaling encoding.trained_factor=4
                                            encoding.original_len=128)
            spawn posbench train "${args[@]}" "hydra.run.dir=$out/finetune/$scaling/steps=$steps/seed=$seed" "${extra[@]}"
        done
    done
done
drain


# 4. training-free scalings and extensions of the parents, every run at the same lengths, and the
# probes of context use on every run; the commands on one run dir one after the other (each holds it)
# (set -e does not reach into a command whose failure `spawn` catches, so each step returns on failure)
scaled() {
    posbench eval checkpoint="$1" "eval.lengths=$lengths" || return
    for scaling in pi ntk dynamic_ntk yarn; do
        posbench eval checkpoint="$1" "eval.lengths=$lengths" eval.rope_scaling=$scaling || return
    done
    posbench eval checkpoint="$1" "eval.lengths=$lengths" eval.extension=self_extend eval.extension_window=64 \
        eval.extension_group=4 || return
    posbench eval checkpoint="$1" "eval.lengths=$lengths" eval.extension=rerope eval.extension_window=64
}
probes() {  # variable tracking's 5 assignments, question and answer take 170 tokens: from 256 up
    posbench eval checkpoint="$1" probe=passkey "probe.lengths=$lengths" "probe.depths=[0,0.5,1]" \
        probe.trials=10 || return
    posbench eval checkpoint="$1" probe=variable_tracking "probe.lengths=[256,512,1024,2048]" \
        "probe.depths=[0,0.5,1]" probe.trials=10
}
parent_evals() {
    if [[ $1 == "$parents/rope/"* ]]; then scaled "$1" || return
    else posbench eval checkpoint="$1" "eval.lengths=$lengths" || return; fi
    probes "$1"
}
while read -r ckpt; do
    run=$(dirname "$(dirname "$ckpt")")
    if [[ $run == "$parents/"* ]]; then spawn parent_evals "$run"; else spawn probes "$run"; fi
done < <(find "$out" "$parents/rope" "$parents/alibi" -name last.pt -path "*checkpoints*" | sort)
drain

posbench report "$out/finetune" "$out/baseline" "$parents/rope" "$parents/alibi" --by train.steps \
    --by encoding.trained_scaling --out "${RESULTS:-results/extension}" --log-y
