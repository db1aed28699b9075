"""The run of a benchmark: the specs of every figure, measured side by side in children, and the
rows they give (:func:`bench`)."""

from __future__ import annotations

import math
import os
import platform
import time
from pathlib import Path

from ..runs.throughput import cpu_model
from .children import (
    DEFAULT_TOKENS,
    MATMUL_N,
    PEER_ENCODINGS,
    PEER_NO_FLASH,
    datasheet_tflops,
    is_peer,
    run_child,
    split_entry,
)

MALLOCS = ("system", "posbench")  # glibc's default; posbench's (freed memory kept in the heap)


def bench(encodings, train_lens, eval_lens, peer: bool, kernels: bool, steps: int, mallocs=MALLOCS,
          log=print, device: str = "cpu", matmuls: bool = True, tokens: dict | None = None,
          models=("tiny",), compiled: bool = False, jobs: int = 1, deadline: float | None = None,
          timeout: float = 900, progress=None, trainer: bool = False) -> dict:
    """Run every measurement on ``device`` (cpu or cuda); -> {"machine": {...}, "rows": [...],
    "kernels": [...]}. ``matmuls=False`` skips the machine's matmul peaks (``--update`` keeps the
    earlier run's machine figures, so measuring them again would be thrown away). ``tokens``:
    {"train": tokens a step, "eval": tokens a pass} (default 4,096 and 16,384), in every row.
    ``models``: presets, measured in this order, each encoding's posbench row before its peer's.
    ``compiled``: training steps under torch.compile. ``jobs``: children at once (their timed
    steps take turns); ``deadline``: ``time.monotonic()`` past which no child starts; ``timeout``:
    seconds a child may take; ``progress(result)``: called with the result so far after each row;
    ``trainer``: each training figure of posbench's also through the real trainer (impl
    ``posbench train``, :func:`~posbench.bench.children._trainer_child`)."""
    import torch

    from ..encodings import REGISTRY
    from ..model.build import autocast_dtype

    unknown = sorted({split_entry(e)[0] for e in encodings} - set(REGISTRY))
    if unknown:
        from ..errors import PosbenchError
        raise PosbenchError(f"unknown encoding(s) {', '.join(unknown)}; valid choices: {', '.join(sorted(REGISTRY))}")
    precision = "bf16" if autocast_dtype(torch.device(device), "auto") is not None else "fp32"
    # bf16 products are emulated, and slow, on a CPU without bf16 instructions: measured only where used
    dtypes = ("float32", "bfloat16") if precision == "bf16" else ("float32",)
    gpu = device == "cuda"
    name = torch.cuda.get_device_name() if gpu else cpu_model()
    n = MATMUL_N["cuda" if gpu else "cpu"]

    def matmul_peaks() -> dict:  # GFLOP/s of each dtype (nan where not measured or it failed)
        got = run_child({"what": "matmul", "dtypes": list(dtypes), "device": device, "n": n}) if matmuls else {}
        return {f"{d}_gflops": got.get(f"{d}_gflops", math.nan) for d in dtypes}

    machine = {"cpu": name, "cores": os.cpu_count(), "device": device, "torch": torch.__version__,
               "python": platform.python_version(), "precision": precision, "matmul_n": n, **matmul_peaks()}
    if gpu:
        machine["datasheet_bf16_tflops"] = datasheet_tflops(name)
    if jobs > 1:
        machine["jobs"] = jobs
    log(f"machine: {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}, {precision}; matmul {n}^3: "
        + (", ".join(f"{d} {machine[f'{d}_gflops']:.0f} GFLOP/s" for d in dtypes) if matmuls else "not measured"))
    impls = ["posbench"] + (["posbench train"] if trainer else []) + (["x-transformers", "x-transformers flash"]
                                                                        if peer else [])
    tokens = {**DEFAULT_TOKENS, **(tokens or {})}
    lock = barrier = None
    if jobs > 1:
        import tempfile

        handle, lock = tempfile.mkstemp(prefix="posbench-bench-", suffix=".lock")
        os.close(handle)
        barrier = tempfile.mkdtemp(prefix="posbench-bench-wave-")
    specs = [{**spec, "lock": lock, "barrier": barrier, "compile_threads": max(1, (os.cpu_count() or 1) // jobs)}
             if lock else spec
             for spec in _specs(models, encodings, mallocs, impls, train_lens, eval_lens, steps, device,
                                tokens, compiled)]
    result = {"machine": machine, "rows": [], "kernels": []}
    try:
        for rows in _measure_all(specs, jobs, deadline, timeout, log):
            result["rows"] = rows
            if progress:
                progress(result)
    finally:
        if lock:
            import shutil

            os.unlink(lock)
            shutil.rmtree(barrier, ignore_errors=True)
    for key, again in matmul_peaks().items():  # again at the end: the higher of the two readings
        machine[key] = max((v for v in (machine[key], again) if v == v), default=math.nan)
    if kernels:
        for kernel in ("sdpa, no bias", "bias per query chunk", "Toeplitz slices (posbench)", "flex attention"):
            got = run_child({"what": "kernel", "kernel": kernel, "length": 8192, "device": device})
            result["kernels"].append({"kernel": kernel, "length": 8192, **got})
            log(f"kernel {kernel:<28} " + (got.get("error") or f"{got['seconds']:.3f} s/layer"
                                            + (f" (compile {got['compile_s']:.0f} s)" if got.get("compile_s") else "")))
    return result


def _specs(models, encodings, mallocs, impls, train_lens, eval_lens, steps, device, tokens, compiled) -> list[dict]:
    """Every model measurement, in the order asked: per model, per encoding, posbench then its peer.
    On a GPU the peer runs in one setting: attn_flash, but for T5's bias (:data:`PEER_NO_FLASH`)."""
    gpu, specs = device == "cuda", []
    for model in models:
        for encoding in encodings:
            for malloc in mallocs:
                for impl in impls:
                    if is_peer(impl) and encoding not in PEER_ENCODINGS:
                        continue
                    if gpu and impl == ("x-transformers" if encoding not in PEER_NO_FLASH else "x-transformers flash"):
                        continue
                    evals = [] if impl == "posbench train" else eval_lens  # the trainer row: training only
                    for kind, lengths in (("train", train_lens), ("eval", evals)):
                        specs += [{"what": "model", "model": model, "encoding": encoding, "impl": impl,
                                   "malloc": malloc,
                                   "kind": kind, "length": length, "steps": steps, "warmup": 2, "device": device,
                                   "tokens": tokens[kind], "compile": compiled and kind == "train"}
                                  for length in lengths]
    return specs


WAVE_KEYS = ("lock", "barrier", "id", "wave", "compile_threads")  # how a child takes its turn: not a row's


def _measure_all(specs, jobs: int, deadline: float | None, timeout: float, log):
    """Measure ``specs``, ``jobs`` children at once, in waves: the children of a wave start
    together, compile side by side, wait until every one of them has compiled (or ended), then
    take turns (the lock) for their warm-up and timed steps, so no figure is timed while another
    child compiles; the next wave starts when the last one ends. After each child, log its line
    and yield the rows so far in the order of ``specs``. A spec not started by ``deadline``
    (``time.monotonic()``) is a row saying so."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    def measure(spec):
        if deadline is not None and time.monotonic() > deadline:
            got = {"error": "not run: past --deadline"}
        else:
            got = run_child(spec, timeout)
        if spec.get("barrier"):  # ended: the wave's others stop waiting for it
            Path(spec["barrier"], f"ended-{spec['id']}").touch()
        return got

    done, size = {}, max(1, jobs)
    for start in range(0, len(specs), size):
        wave = list(range(start, min(len(specs), start + size)))  # the ids a child of it waits for
        with ThreadPoolExecutor(len(wave)) as pool:  # one thread per child; each waits on its process
            futures = {pool.submit(measure, {**specs[i], "id": i, "wave": wave}): i for i in wave}
            for future in as_completed(futures):
                yield _logged(done, futures[future], specs, future.result(), log)


def _logged(done: dict, i: int, specs, got: dict, log) -> list[dict]:
    """Record spec ``i``'s figures in ``done``, log its line; -> the rows so far, in spec order."""
    spec = {k: v for k, v in specs[i].items() if k not in WAVE_KEYS}
    done[i] = {**spec, **got}
    peak = f"  {got['peak_mb']:8,.0f} MB" if got.get("peak_mb") is not None else ""
    figure = got.get("error") or (f"{got['tokens_per_s']:10,.0f} tok/s{peak}"
                                  + (f"  (compile {got['compile_s']:.0f} s)" if got.get("compile_s") else ""))
    log(f"{spec['model']:<6} {spec['encoding']:<14} {spec['impl']:<22} {spec['malloc']:<8} "
        f"{spec['kind']:<5} {spec['length']:>6}  {figure}")
    return [done[j] for j in sorted(done)]


def measured(result: dict):
    """The rows as a DataFrame, with the columns older bench.json files lack: ``malloc`` (there,
    posbench ran under its own setting and the peer under ``machine.peer_malloc``), ``params``,
    ``tokens`` (a step or a pass; there, the defaults) and ``model`` (there, ``tiny``)."""
    import pandas as pd

    df = pd.DataFrame(result["rows"])
    for col in ("tokens_per_s", "peak_mb", "error", "params", "seconds", "compile_s"):
        if col not in df:
            df[col] = None
    df["model"] = df.model.fillna("tiny") if "model" in df else "tiny"  # rows from before --model: model=tiny
    if "malloc" not in df:
        df["malloc"] = None
    peer_malloc = result["machine"].get("peer_malloc", "system")
    df["malloc"] = df.malloc.fillna(df.impl.map(lambda impl: peer_malloc if is_peer(impl) else "posbench"))
    defaults = df.kind.map(DEFAULT_TOKENS)  # rows from before --train-tokens / --eval-tokens ran with the defaults
    df["tokens"] = defaults if "tokens" not in df else df.tokens.fillna(defaults)
    return df
