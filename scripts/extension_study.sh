#!/usr/bin/env bash
# Regenerates results/extension/: how cheaply a rope model trained short is extended by a little
# training at a longer length, against training-free scaling and against training long from the
# start with the same compute.
#
# Parents: the headline's rope runs (experiment=reference: train_len 128, 4,883 steps of 32
# windows = 20.0M tokens, warmup-stable-decay to lr 1e-4), trained here where outputs/reference
# does not hold them (the same command and folder as scripts/reference.sh, so the two share them),
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
# split, then the probes (passkey and variable tracking at 128 .. 2048). Re-running resumes.
#   bash scripts/extension_study.sh         # SEEDS="0 1 2" for a third seed
set -euo pipefail
cd "$(dirname "$0")/.."
read -ra seeds <<< "${SEEDS:-0 1}"
parents=${PARENTS:-outputs/reference}
out=${OUT:-outputs/extension}
read -ra extra <<< "${EXTRA:-train.compile=true}"
launcher=(hydra/launcher="${LAUNCHER:-local_parallel}")
[ "${LAUNCHER:-}" = basic ] && launcher=()
lengths="[128,256,512,1024,2048]"
long=512
short_steps=100 long_steps=400
seed_list=$(IFS=,; echo "${seeds[*]}")

# 1. parents (rope) and alibi, at the reference budget
posbench -m train experiment=reference encoding=rope,alibi seed="$seed_list" "${extra[@]}" "${launcher[@]}" \
    "hydra.sweep.dir='$parents'" "hydra.sweep.subdir='\${encoding.name}/seed=\${seed}'"

# 2. extension by fine-tuning, two jobs side by side
jobs=()
for seed in "${seeds[@]}"; do
    parent="$parents/rope/seed=$seed"
    for scaling in none pi ntk yarn; do
        for steps in $short_steps $long_steps; do
            args=(experiment=reference seed="$seed" encoding=rope train.init_from="$parent" train.train_len=$long
                  train.steps=$steps train.schedule=constant train.lr=1e-4 train.warmup_steps=10 "eval.lengths=$lengths")
            [ "$scaling" = none ] || args+=(encoding.trained_scaling=$scaling encoding.trained_factor=4
                                            encoding.original_len=128)
            jobs+=("${args[*]} hydra.run.dir=$out/finetune/$scaling/steps=$steps/seed=$seed")
        done
    done
done
run_job() { # shellcheck disable=SC2086
    posbench train $1 "${extra[@]}"; }
for ((i = 0; i < ${#jobs[@]}; i += 2)); do
    run_job "${jobs[i]}" & first=$!
    [ $((i + 1)) -lt ${#jobs[@]} ] && run_job "${jobs[i + 1]}"
    wait "$first"
done

# 3. the compute-matched baseline: rope from scratch at 512 for the parent's + the extension's FLOPs
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
posbench -m train "${common[@]}" seed="$seed_list" train.steps="$match_long" "train.save_steps=[$keep]" \
    "hydra.sweep.dir='$out/baseline/steps=$match_long'"
posbench -m train "${common[@]}" seed="$seed_list" train.steps="$match_short" \
    "train.branch_from='$out/baseline/steps=$match_long/seed=\${seed}'" "hydra.sweep.dir='$out/baseline/steps=$match_short'"

# 4. training-free scalings and extensions of the parents, and every run at the same lengths
for seed in "${seeds[@]}"; do
    for run in "$parents/rope/seed=$seed" "$parents/alibi/seed=$seed"; do
        posbench eval checkpoint="$run" "eval.lengths=$lengths"
    done
    parent="$parents/rope/seed=$seed"
    for scaling in pi ntk dynamic_ntk yarn; do
        posbench eval checkpoint="$parent" "eval.lengths=$lengths" eval.rope_scaling=$scaling
    done
    posbench eval checkpoint="$parent" "eval.lengths=$lengths" eval.extension=self_extend eval.extension_window=64 \
        eval.extension_group=4
    posbench eval checkpoint="$parent" "eval.lengths=$lengths" eval.extension=rerope eval.extension_window=64
done

# 5. probes of context use on every run
find "$out" "$parents/rope" "$parents/alibi" -name last.pt -path "*checkpoints*" | sort | while read -r ckpt; do
    run=$(dirname "$(dirname "$ckpt")")
    for probe in passkey variable_tracking; do
        posbench eval checkpoint="$run" probe=$probe "probe.lengths=$lengths" "probe.depths=[0,0.5,1]" probe.trials=10
    done
done

posbench report "$out/finetune" "$out/baseline" "$parents/rope" "$parents/alibi" --by train.steps \
    --by encoding.trained_scaling --out "${RESULTS:-results/extension}" --log-y
