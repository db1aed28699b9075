"""How far a learned position bias moved from where it started: each run's initial model is
rebuilt from its config.yaml and seed, and its bias by distance compared with the run's final one.

    python scripts/bias_drift.py results/cpu_quick/runs/t5/seed=0 results/ablations/t5/runs/t5/seed=0

A run is a run dir with a checkpoint or an exported run (its ``learned_bias.npz``); its final
table is what ``posbench report`` draws (posbench.report.learned_bias.run_bias). The initial one
is drawn as ``posbench train`` draws it: ``seed_everything(seed)``, then ``build_model`` with the
config's ``data.vocab_size`` (the embedding's size decides how many numbers are drawn before the
bias; a corpus whose tokenizer stopped short of that size would need its own). Per run, one line:
the standard deviation of the bias at the start and the end, the mean absolute move of an entry,
and the correlation of the final table with the initial one (1: the model trained around the
bias it was given; about 0: it learned one of its own). Used by results/ablations/README.md,
where 400 steps of AdamW barely move T5's N(0, 1) table scaled by sqrt(head_dim).
"""

import argparse
import sys
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from posbench.errors import PosbenchError
from posbench.model.build import build_model
from posbench.report.learned_bias import bias_by_distance, run_bias
from posbench.train.loop import seed_everything


def initial_bias(cfg, max_distance: int) -> np.ndarray:
    """The bias by distance of the model ``cfg`` starts from, rows ordered as bias_by_distance's."""
    seed_everything(int(cfg.seed))
    model = build_model(cfg, int(cfg.data.vocab_size))
    return bias_by_distance(model.encoding, max_distance).bias.to_numpy()


def drift(run: Path) -> dict:
    if not (run / "config.yaml").is_file():
        raise PosbenchError(f"bias_drift: {run} is not a run dir (no config.yaml); valid: run dirs or exported runs")
    found = run_bias(run)
    if found is None:
        raise PosbenchError(f"bias_drift: {run} has no learned position bias (no checkpoint or "
                            "learned_bias.npz of an encoding with one); "
                            "valid: runs of t5, kerple, fire, dynamic, alibi with learned slopes")
    final = found[1].sort_values(["layer", "head", "distance"], ignore_index=True)
    start = initial_bias(OmegaConf.load(run / "config.yaml"), int(final.distance.max()))
    end = final.bias.to_numpy()
    corr = float(np.corrcoef(start, end)[0, 1]) if start.std() > 0 and end.std() > 0 else float("nan")
    return {"run": str(run), "std_start": float(start.std()), "std_end": float(end.std()),
            "mean_abs_move": float(np.abs(end - start).mean()), "corr": corr}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path,
                        help="run dirs or exported runs of an encoding with a learned bias")
    args = parser.parse_args(argv)
    try:
        found = [drift(run) for run in args.runs]
    except PosbenchError as e:
        print(e, file=sys.stderr)
        return 2
    print("| run | std at start | std at end | mean abs move | corr(start, end) |\n|---|---|---|---|---|")
    for d in found:
        print(f"| {d['run']} | {d['std_start']:.3f} | {d['std_end']:.3f} | {d['mean_abs_move']:.3f} "
              f"| {d['corr']:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
