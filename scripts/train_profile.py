"""Where a training step's time goes, kernel by kernel: the bench's step under torch.profiler.

For each encoding (a bench entry: ``rope``, ``alibi+model.window=64``), the training step of
``posbench bench`` (:func:`posbench.bench.children._posbench_model`: preset ``--model``, no
dropout, ``--tokens`` a step at ``--train-len``, bf16 autocast where the device has it, AdamW,
clipping; compiled unless ``--no-compile``) is compiled and warmed up, then ``--steps`` steps run
under ``torch.profiler`` (CPU and, on a GPU, CUDA activities). Written to ``--out``, as each
encoding finishes:

* ``ENTRY.txt``: the profiler's table of operators and kernels by self device time (CPU time on
  a CPU), the top ``--rows``;
* ``kernels.csv``: per encoding and kernel (or operator) its self device time a step in ms and
  its calls a step;
* ``compare.md``: per encoding its step time, and each encoding after the first against the
  first (``--encodings rope nope``: what rope spends that nope does not): the kernels whose time a
  step differs most, with both times;
* ``ENTRY.error.txt`` where an encoding's step fails: the whole traceback (a bench row keeps one
  line), e.g. to find why flex attention fails inside a compiled model
  (``POSBENCH_FLEX=1 python scripts/train_profile.py --device cuda --encodings alibi t5``).

Kernel names are the device's own (Triton kernels named by what inductor fused into them), so
a comparison across encodings reads names that both share (matmuls, the optimizer) and names one
alone has. Run on a GPU, with the shape of the GPU bench:

    python scripts/train_profile.py --device cuda --model base --train-len 512 --tokens 32768 \\
        --encodings nope rope --out results/bench/gpu_profile

On a CPU (``--no-compile``, a small step) it runs the same code, which the tests use.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import pandas as pd


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--encodings", nargs="+", default=["nope", "rope"], metavar="ENTRY",
                   help="bench entries, the first the reference of compare.md (default: nope rope)")
    p.add_argument("--model", default="base", help="model preset (conf/model/NAME.yaml; default base)")
    p.add_argument("--train-len", type=int, default=512)
    p.add_argument("--tokens", type=int, default=32768, help="tokens a step (batch = tokens / train-len)")
    p.add_argument("--steps", type=int, default=5, help="profiled steps, after the compiling and warm-up ones")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--rows", type=int, default=40, help="rows of each ENTRY.txt table")
    p.add_argument("--out", default="results/bench/gpu_profile")
    return p


def step_of(entry: str, ns):
    """The bench's training step for ``entry`` -> (step function, tokens a step)."""
    import torch

    from posbench.bench.children import VOCAB, _posbench_model, train_step
    from posbench.model.build import autocast_dtype

    dev = torch.device(ns.device)
    torch.manual_seed(0)
    model = _posbench_model(entry, ns.train_len, ns.train_len, ns.model).to(dev)
    dtype = autocast_dtype(dev, "auto")
    batch = max(1, ns.tokens // ns.train_len)
    x, y = (torch.randint(0, VOCAB, (batch, ns.train_len), device=dev) for _ in range(2))
    amp = torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None)
    return train_step(model, x, y, amp, ns.compile), x.numel()


def profile(entry: str, ns) -> tuple[pd.DataFrame, float, str]:
    """-> (per kernel: self time a step in ms and calls a step), ms a step, the profiler's table."""
    import torch
    from torch.profiler import ProfilerActivity

    gpu = ns.device == "cuda"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    step, _ = step_of(entry, ns)
    for _ in range(2 + ns.warmup):  # compiling (forward, backward), then warm-up
        step()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    start = time.perf_counter()
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(ns.steps):
            step()
        sync()
    ms = (time.perf_counter() - start) * 1e3 / ns.steps
    events = prof.key_averages()
    key = "self_device_time_total" if gpu else "self_cpu_time_total"
    rows = [{"kernel": e.key, "ms_a_step": getattr(e, key) / 1e3 / ns.steps, "calls_a_step": e.count / ns.steps}
            for e in events if getattr(e, key) > 0]
    frame = pd.DataFrame(rows, columns=["kernel", "ms_a_step", "calls_a_step"])
    table = events.table(sort_by=key, row_limit=ns.rows, max_name_column_width=90)
    return frame.sort_values("ms_a_step", ascending=False, ignore_index=True), ms, table


def compare(frames: dict[str, pd.DataFrame], steps_ms: dict[str, float], ns, top: int = 15) -> str:
    """compare.md: each encoding's step time, then each against the first, kernel by kernel."""
    names = list(frames)
    out = [f"# Training step by kernel: model={ns.model}, T={ns.train_len}, {ns.tokens:,} tokens a step, "
           f"{ns.device}, {'compiled' if ns.compile else 'eager'}", "",
           f"Command: `python scripts/train_profile.py {' '.join(ns.argv)}`", "",
           "Step time under the profiler (its overhead included), and the profiler's self time a step of each "
           "kernel (device time on a GPU, CPU time on a CPU).", "",
           "| encoding | ms a step | kernels' time a step (ms) |", "|---|---|---|"]
    out += [f"| {n} | {steps_ms[n]:.2f} | {frames[n].ms_a_step.sum():.2f} |" for n in names]
    ref = names[0]
    for other in names[1:]:
        both = frames[ref].merge(frames[other], on="kernel", how="outer",
                                 suffixes=(f" {ref}", f" {other}")).set_index("kernel").fillna(0.0)
        both["difference"] = both[f"ms_a_step {other}"] - both[f"ms_a_step {ref}"]
        both = both.reindex(both.difference.abs().sort_values(ascending=False).index).head(top)
        out += ["", f"## {other} against {ref}: the {top} kernels whose time a step differs most", "",
                f"| kernel | {ref} ms | {other} ms | {other} - {ref} ms | calls {ref} | calls {other} |",
                "|---|---|---|---|---|---|"]
        out += [f"| `{k[:90]}` | {r[f'ms_a_step {ref}']:.3f} | {r[f'ms_a_step {other}']:.3f} | {r.difference:+.3f} | "
                f"{r[f'calls_a_step {ref}']:g} | {r[f'calls_a_step {other}']:g} |" for k, r in both.iterrows()]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ns = _parser().parse_args(argv)
    ns.argv = list(sys.argv[1:] if argv is None else argv)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    frames, steps_ms, failed = {}, {}, []
    for entry in ns.encodings:
        name = entry.replace("/", "_")
        try:
            frame, ms, table = profile(entry, ns)
        except Exception:  # noqa: BLE001 - the whole traceback is the figure here
            (out / f"{name}.error.txt").write_text(traceback.format_exc())
            print(f"{entry}: failed; traceback in {out / f'{name}.error.txt'}", flush=True)
            failed.append(entry)
            continue
        frames[entry], steps_ms[entry] = frame, ms
        (out / f"{name}.txt").write_text(table + "\n")
        rows = pd.concat([f.assign(encoding=e) for e, f in frames.items()], ignore_index=True)
        rows[["encoding", "kernel", "ms_a_step", "calls_a_step"]].to_csv(out / "kernels.csv", index=False)
        (out / "compare.md").write_text(compare(frames, steps_ms, ns))
        print(f"{entry}: {ms:.2f} ms a step; top: {frame.kernel.iloc[0][:60]} {frame.ms_a_step.iloc[0]:.3f} ms",
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
