#!/usr/bin/env bash
# Regenerates results/ablations/: what the two parameterisation choices of the fair
# comparison change, each beside the default runs of scripts/reference_comparison.sh:
#   t5/         T5's bias scaled by sqrt(head_dim) (x-transformers, the default) vs unscaled
#               (Mesh TensorFlow / Hugging Face, encoding.bias_scale=none), 3 seeds;
#   embed_scale/ token embeddings times sqrt(d_model) (fairseq, the ALiBi paper; the default)
#               vs unscaled (model.embed_scale=none) for sinusoidal, learned, alibi, rope, 2 seeds.
# Each report draws both settings as lines of their own (posbench report --by KEY).
set -euo pipefail
cd "$(dirname "$0")/.."
reference=${REFERENCE:-outputs/reference_cpu_quick}
launcher=(hydra/launcher="${LAUNCHER:-local_parallel}")  # 1.29-1.49x the tokens/s of one job at a time
[ "${LAUNCHER:-}" = basic ] && launcher=()                    # on 2 CPU cores (results/bench/sweep_throughput.md)
posbench -m train seed=0,1,2 encoding=t5 encoding.bias_scale=none "${launcher[@]}" \
    hydra.sweep.dir=outputs/ablation_t5
posbench report "$reference"/t5 outputs/ablation_t5 --by encoding.bias_scale --out results/ablations/t5 --no-reference --log-y
posbench -m train seed=0,1 encoding=sinusoidal,learned,alibi,rope model.embed_scale=none \
    "${launcher[@]}" hydra.sweep.dir=outputs/ablation_embed_scale
posbench report "$reference"/{sinusoidal,learned,alibi,rope}/seed={0,1} outputs/ablation_embed_scale \
    --by model.embed_scale --out results/ablations/embed_scale --no-reference --log-y
