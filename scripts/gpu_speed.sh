#!/usr/bin/env bash
# Training speed on one GPU, in one command under ten minutes: the GPU tests of the step that
# never waits and of flex attention, the kernel profile of rope against nope, the whole
# traceback of flex attention inside the compiled model, and the bench (posbench against
# x-transformers where installed, the real trainer beside the bench's loop), the static biases
# again with cuDNN's fused SDPA first (POSBENCH_SDPA_BIAS=cudnn), and the long evaluation's speed
# and memory against plain transformers. Each part writes
# under $OUT as it finishes and is skipped when its files are there, so the same command resumes
# a cut-off run. docs/clusters.md ("Training speed on one GPU") says what each part answers.
#
#   OUT=results/bench/gpu_speed bash scripts/gpu_speed.sh
#
# Settings (environment): DEVICE (cuda), MODEL (base), TRAIN_LEN (512), TOKENS (32768 a step),
# JOBS (bench children side by side, 6), DEADLINE (seconds the bench may start children, 300),
# TESTS (1: run tests/test_gpu.py's parts first; 0: skip), LONG (1: the long evaluation against
# plain transformers last, scripts/long_eval_speed.py; 0: skip). On a CPU, a quick check of the script:
#   DEVICE=cpu MODEL=tiny TRAIN_LEN=16 TOKENS=64 JOBS=1 TESTS=0 OUT=/tmp/gpu_speed bash scripts/gpu_speed.sh
set -u
OUT=${OUT:-results/bench/gpu_speed}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-base}
TRAIN_LEN=${TRAIN_LEN:-512}
TOKENS=${TOKENS:-32768}
JOBS=${JOBS:-6}
DEADLINE=${DEADLINE:-300}
TESTS=${TESTS:-1}
LONG=${LONG:-1}
mkdir -p "$OUT"
begun=$(date +%s)
say() { echo "gpu_speed: $* ($(( $(date +%s) - begun )) s)"; }
compile=$([ "$DEVICE" = cuda ] && echo --compile || echo --no-compile)
bench=(--device "$DEVICE" --model "$MODEL" --train-lens "$TRAIN_LEN" --eval-lens --train-tokens "$TOKENS"
       --jobs "$JOBS" --deadline "$DEADLINE")  # the shape and waves of both bench parts

if [ "$TESTS" = 1 ] && [ ! -s "$OUT/tests.txt" ]; then
    python -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "never_waits or flex" 2>&1 | tail -25 > "$OUT/tests.txt"
    say "tests: $(tail -1 "$OUT/tests.txt")"
fi
if [ ! -s "$OUT/profile/compare.md" ]; then
    python scripts/train_profile.py --device "$DEVICE" $compile --model "$MODEL" --train-len "$TRAIN_LEN" \
        --tokens "$TOKENS" --encodings nope rope --out "$OUT/profile" > "$OUT/profile.log" 2>&1
    say "profile of nope and rope: $(tail -1 "$OUT/profile.log")"
fi
if [ ! -s "$OUT/flex/done" ]; then  # flex attention inside the compiled model: a figure or the whole traceback
    POSBENCH_FLEX=1 python scripts/train_profile.py --device "$DEVICE" $compile --model "$MODEL" \
        --train-len "$TRAIN_LEN" --tokens "$TOKENS" --steps 3 --encodings alibi t5 --out "$OUT/flex" \
        > "$OUT/flex.log" 2>&1
    echo "exit $?" > "$OUT/flex/done"
    say "flex: $(cat "$OUT/flex/done"); $(ls "$OUT/flex" | tr '\n' ' ')"
fi
if [ ! -s "$OUT/bench/bench.md" ]; then
    peer=$(python -c "import x_transformers" 2>/dev/null && echo "" || echo --no-peer)
    python -m posbench.bench "${bench[@]}" --encodings nope rope alibi t5 kerple_log fox $peer --trainer \
        --out "$OUT/bench" > "$OUT/bench.log" 2>&1
    say "bench: $(grep -c . "$OUT/bench/bench.csv") lines in bench.csv"
fi
if [ ! -s "$OUT/bench_cudnn/bench.md" ]; then  # the static biases with cuDNN's fused SDPA first
    POSBENCH_SDPA_BIAS=cudnn python -m posbench.bench "${bench[@]}" --encodings alibi t5 kerple_log --no-peer \
        --out "$OUT/bench_cudnn" > "$OUT/bench_cudnn.log" 2>&1
    say "bench, cuDNN first for a bias: $(grep -c . "$OUT/bench_cudnn/bench.csv") lines in bench.csv"
fi
if [ "$LONG" = 1 ]; then  # long evaluation against plain transformers; resumes row by row
    if [ "$DEVICE" = cuda ]; then long=(); else  # a toy shape on a CPU
        long=(--shape tiny --run-model tiny --lengths 64 128 --run-lengths 64 128 --run-train-len 16 --tokens 256)
    fi
    python scripts/long_eval_speed.py --device "$DEVICE" "${long[@]}" --out "$OUT/long_eval" > "$OUT/long_eval.log" 2>&1
    say "long evaluation: $(tail -1 "$OUT/long_eval.log")"
fi
say "done; files under $OUT"
