#!/usr/bin/env bash
# Regenerates results/variants/: the non-default variants of each scheme under
# experiment=zoo_quick (the same budget as results/zoo_quick, whose runs give the defaults), the
# same two seeds. Jobs run side by side, one torch thread each (LAUNCHER=basic: one after the other).
set -euo pipefail
cd "$(dirname "$0")/.."
sweep=outputs/variants
launcher=(hydra/launcher="${LAUNCHER:-local_parallel}")
[ "${LAUNCHER:-}" = basic ] && launcher=()
common=(experiment=zoo_quick seed=0,1 "${launcher[@]}" hydra.sweep.dir=$sweep)
posbench -m train encoding=sinusoidal encoding.layout=concat "${common[@]}"
posbench -m train encoding=multiplicative encoding.table=learned "${common[@]}"
posbench -m train encoding=rope encoding.pairing=interleaved "${common[@]}"
posbench -m train encoding=shaw encoding.max_distance=2,4,64 "${common[@]}"
posbench -m train encoding=alibi encoding.form=symmetric "${common[@]}"
posbench -m train encoding=alibi encoding.learned_slopes=true "${common[@]}"
posbench -m train encoding=t5 encoding.per_layer=true "${common[@]}"
python scripts/variant_table.py outputs/zoo_quick $sweep > results/variants/variants.md
