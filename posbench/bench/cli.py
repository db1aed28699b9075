"""``posbench bench``'s command line: parse, run, write bench.md, bench.csv and bench.json."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

from ..runs.kernels import KERNEL_SETTINGS
from .children import EVAL_TOKENS, GPU_TRAIN_TOKENS, MODEL_OPTION_ENTRIES, TRAIN_TOKENS, model_names
from .run import MALLOCS, bench, measured
from .tables import tables

CPU_STEPS = 8  # timed steps a training figure on a CPU: their mean (a step is long)
GPU_STEPS = 50  # on a GPU: their median (steps of milliseconds, each timed by CUDA events)


def command_line(argv: list[str], environ=os.environ) -> str:
    """The bench's command as a shell would repeat it: the kernel choices set in the environment
    (:data:`KERNEL_SETTINGS`) first, since its figures depend on them."""
    settings = [f"{k}={shlex.quote(environ[k])}" for k in KERNEL_SETTINGS if environ.get(k)]
    return " ".join([*settings, shlex.join(["posbench", "bench", *argv])])


def _parser() -> argparse.ArgumentParser:
    from ..encodings import REGISTRY

    parser = argparse.ArgumentParser(prog="posbench bench", description=__doc__.splitlines()[0])
    parser.add_argument("--encodings", nargs="+", default=[*sorted(REGISTRY), *MODEL_OPTION_ENTRIES], metavar="NAME",
                        help="default: all, and each model option with one encoding; NAME+KEY=VALUE adds a config "
                             "override, e.g. nope+model.length_scaling=ssmax")
    parser.add_argument("--model", nargs="+", default=["tiny"], choices=model_names(), metavar="NAME",
                        help="model presets (conf/model/NAME.yaml), measured in this order (default: tiny)")
    parser.add_argument("--train-lens", nargs="*", type=int, default=None, metavar="T",
                        help="default: 128 512 on the CPU, 512 on a GPU")
    parser.add_argument("--eval-lens", nargs="*", type=int, default=None, metavar="L",
                        help="default: 1024 4096 8192 16384 on the CPU, none on a GPU")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed training steps per figure, after 2 warm-up steps (default: 8 on the CPU, their "
                             "mean; 50 on a GPU, their median)")
    parser.add_argument("--train-tokens", type=int, default=None, metavar="N",
                        help=f"tokens a training step (batch = N / train length; default {TRAIN_TOKENS} on the CPU, "
                             f"{GPU_TRAIN_TOKENS} on a GPU)")
    parser.add_argument("--eval-tokens", type=int, default=EVAL_TOKENS, metavar="N",
                        help=f"tokens an evaluation pass (default {EVAL_TOKENS}: batch = N / length)")
    parser.add_argument("--no-peer", action="store_true", help="leave out x-transformers")
    parser.add_argument("--trainer", action=argparse.BooleanOptionalAction, default=None,
                        help="also time each training figure through the real trainer (posbench train on the packaged "
                             "corpus) beside the bench's own loop (default: on a GPU only)")
    parser.add_argument("--kernels", action="store_true",
                        help="also compare attention kernels (flex attention compiles)")
    parser.add_argument("--malloc", nargs="+", choices=MALLOCS, default=None,
                        help="allocator settings every implementation is measured under (default: both on the CPU, "
                             "system on a GPU): glibc's default (system) and posbench's, freed memory kept in the "
                             "heap (posbench)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the models run (default: cpu); cuda: the first visible GPU")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="training steps under torch.compile (default: on a GPU only)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="children at once, compiling side by side, timed one at a time (default 1; for a GPU: "
                             "on a CPU the others' work shares the cores being timed)")
    parser.add_argument("--deadline", type=float, default=None, metavar="S",
                        help="start no child after S seconds (the rows not started say so); default: none")
    parser.add_argument("--timeout", type=float, default=900, metavar="S",
                        help="seconds a child may take (default 900)")
    parser.add_argument("--update", action="store_true",
                        help="re-measure --encodings at the lengths given and replace those rows in --out's "
                             "bench.json (other rows, machine figures and kernels kept unless --kernels)")
    parser.add_argument("--out", default="results/bench", help="where bench.csv, bench.json and bench.md go")
    return parser


def main(argv: list[str] | None = None) -> None:
    from ..errors import PosbenchError

    argv = sys.argv[1:] if argv is None else list(argv)
    ns = _parser().parse_args(argv)
    begun = time.monotonic()
    gpu, peer = ns.device == "cuda", not ns.no_peer
    train_lens = ns.train_lens if ns.train_lens is not None else ([512] if gpu else [128, 512])
    eval_lens = ns.eval_lens if ns.eval_lens is not None else ([] if gpu else [1024, 4096, 8192, 16384])
    train_tokens = ns.train_tokens or (GPU_TRAIN_TOKENS if gpu else TRAIN_TOKENS)
    if gpu:
        import torch

        if not torch.cuda.is_available():
            raise PosbenchError("posbench bench --device cuda: no CUDA GPU is visible here; valid here: --device cpu")
    if ns.jobs < 1:
        raise PosbenchError(f"posbench bench --jobs {ns.jobs}: valid: an integer >= 1")
    mallocs = ns.malloc or (["system"] if gpu else list(MALLOCS))
    if peer:
        try:
            import x_transformers  # noqa: F401
        except ImportError:
            raise PosbenchError('x-transformers is not installed; valid: pip install -e ".[bench]", or --no-peer')
    out = Path(ns.out)
    if ns.update and not (out / "bench.json").is_file():
        raise PosbenchError(f"--update needs an earlier run's {out / 'bench.json'}; valid: run posbench bench "
                            f"--out {out} first, or leave out --update")
    for flag, value, least in (("--train-tokens", train_tokens, max(train_lens, default=1)),
                               ("--eval-tokens", ns.eval_tokens, max(eval_lens, default=1))):
        if value < least:
            raise PosbenchError(f"posbench bench {flag} {value}: fewer tokens than one window of {least}; valid: "
                                f"an integer >= {least}")
    command = command_line(argv)
    old = json.loads((out / "bench.json").read_text()) if ns.update else None
    from ..runs.rundir import atomic_write_text

    def write(result: dict) -> str:
        """bench.csv, bench.json and bench.md from ``result`` (with --update: merged into the earlier run's)."""
        result = _merged(old, result) if old else result
        result["command"] = command
        out.mkdir(parents=True, exist_ok=True)
        text = tables(result)
        atomic_write_text(out / "bench.csv", measured(result).to_csv(index=False))  # every column, errors or none
        atomic_write_text(out / "bench.json", json.dumps(result, indent=1))
        atomic_write_text(out / "bench.md", text)
        return text

    steps = ns.steps or (GPU_STEPS if gpu else CPU_STEPS)
    result = bench(ns.encodings, train_lens, eval_lens, peer, ns.kernels, steps, mallocs,
                   log=lambda line: print(line, flush=True), device=ns.device, matmuls=not ns.update,
                   tokens={"train": train_tokens, "eval": ns.eval_tokens}, models=ns.model,
                   compiled=gpu if ns.compile is None else ns.compile, jobs=ns.jobs,
                   deadline=None if ns.deadline is None else begun + ns.deadline, timeout=ns.timeout, progress=write,
                   trainer=gpu if ns.trainer is None else ns.trainer)
    text = write(result)
    print("\n" + text)
    print(f"wrote {out / 'bench.md'}, {out / 'bench.csv'}, {out / 'bench.json'}")


def _merged(old: dict, result: dict) -> dict:
    """``--update``: the earlier run's machine figures and rows, the rows measured again replaced."""
    rows = measured(old).to_dict("records")  # older files: the allocator and model of each row
    key = ("model", "encoding", "impl", "malloc", "kind", "length")
    fresh = {tuple(r.get(k, "tiny" if k == "model" else None) for k in key) for r in result["rows"]}
    return {"machine": old["machine"], "kernels": result["kernels"] or old["kernels"],
            "rows": [r for r in rows if tuple(r[k] for k in key) not in fresh] + result["rows"]}
