"""`posbench bench`: training and evaluation speed and memory of every encoding, beside a peer.

Every figure comes from one run on one machine, each measurement in its own child process
so that its peak resident memory (:func:`peak_rss_mb`: Python, torch, model and activations) is
its own. The model is the benchmark shape of the performance issue: 4 layers, d_model 256,
8 heads, FFN 1024, vocabulary 8192 (``model=tiny``), bf16 autocast where the CPU has it.

* **train**: tokens/s of full training steps (forward, backward, gradient clipping, AdamW)
  at each train length, 4,096 tokens a step (batch = 4096 / train_len; ``--train-tokens``),
  after warm-up steps;
* **eval**: tokens/s and peak memory of one no-grad forward pass scoring 16,384 tokens
  (batch = 16384 / length windows; ``--eval-tokens``), the way ``posbench eval`` runs, after a
  warm-up pass at 1,024 tokens. Fewer tokens make a quick look on a slow machine (and the
  tests); bench.md states the counts each table ran with;
* **peer**: the same figures for x-transformers (``pip install -e ".[bench]"``) where it has
  the encoding, at whichever of its two attention settings (``attn_flash`` on or off) is
  faster, and the ratio posbench / x-transformers. The peer has posbench's shape and
  parameter count: head dimension d_model / heads (``attn_dim_head``; its default is 64),
  rotary over the whole head (``rotary_emb_dim``; its default is half) and tied input and
  output embeddings (``tie_embedding``); both counts are in every row and table;
* **allocator**: every implementation is measured under each setting of ``--malloc``: glibc's
  default (``system``) and posbench's (``posbench``, :func:`posbench.model.build.keep_freed_memory`),
  so each ratio compares the two libraries in the same environment;
* **FLOP/s**: training FLOPs per token, 6 N (N = matmul parameters, output layer included)
  plus 6 n_layers d_model T (causal attention, forward and backward), times tokens/s, as a
  fraction of the matmul peak, in the precision the run uses (bf16 autocast where the CPU
  has it, else fp32), measured on 2048^3 products in the same run (the best round of
  several, at the start and at the end);
* **kernels** (``--kernels``): one attention layer at 8,192 tokens with an ALiBi bias, by
  kernel: SDPA without bias (the floor), the bias built per query chunk, Toeplitz slices of
  one bias, and flex attention with the bias as ``score_mod`` (compiled; compile time apart).

Children run under a 16 GiB address-space cap, so a kernel that materialises a
(heads, T, T) matrix fails with "out of memory" instead of swapping the machine.

``--device cuda`` measures the same on a GPU: every figure timed between two
``torch.cuda.synchronize()`` calls, peak memory as the GPU's high-water mark of allocated memory
(``torch.cuda.max_memory_allocated``) instead of resident memory, the matmul peak on the GPU, bf16
autocast where the GPU has it, and no address-space cap (CUDA reserves more than 16 GiB of it).
The allocator settings are a CPU matter: on a GPU only ``system`` is measured unless ``--malloc``
says otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

PEER_ENCODINGS = ("sinusoidal", "learned", "rope", "alibi", "t5", "xpos", "nope")
SHAPE = {"d_model": 256, "n_layers": 4, "n_heads": 8, "d_ff": 1024, "vocab": 8192}
TRAIN_TOKENS = 4096  # per training step
EVAL_TOKENS = 16384  # per evaluation pass
DEFAULT_TOKENS = {"train": TRAIN_TOKENS, "eval": EVAL_TOKENS}
MEMORY_CAP = 16 << 30  # bytes of address space per child


# ---- inside a child process --------------------------------------------------------------

def peak_rss_mb() -> float:
    """This process's peak resident memory in MB: VmHWM, the high-water mark of its own address
    space. Not ``ru_maxrss``: on Linux a process started by fork and exec inherits there the
    resident size its parent had when it forked, so a child of a large parent would report the
    parent's size."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux: kB on most systems


def _device(spec: dict):
    """-> (the spec's torch device, a function that waits for it, peak memory in MB so far)."""
    import torch

    dev = torch.device(spec.get("device", "cpu"))
    if dev.type == "cuda":
        return dev, torch.cuda.synchronize, lambda: torch.cuda.max_memory_allocated(dev) / 2 ** 20
    return dev, lambda: None, peak_rss_mb


def split_entry(entry: str) -> tuple[str, list[str]]:
    """'nope+model.length_scaling=ssmax' -> ('nope', ['model.length_scaling=ssmax']): a bench
    entry is an encoding, optionally with config overrides (a model option, an encoding option)."""
    name, *overrides = entry.split("+")
    return name, overrides


# the model options of `posbench encodings`, each measured with one encoding in the default bench
MODEL_OPTION_ENTRIES = ("nope+model.length_scaling=ssmax", "rope+model.length_scaling=logn",
                        "rope+model.qk_norm=true", "rope+model.window=64")


def _posbench_model(encoding: str, train_len: int, max_len: int):
    """The benchmark model; a position table (``encoding.max_len``) gets ``max_len`` entries so it
    can run at every measured length, as x-transformers' ``max_seq_len``. ``encoding``: a bench
    entry (:func:`split_entry`)."""
    from hydra import compose, initialize_config_dir

    from .model.build import build_model
    from .config import conf_dir

    name, overrides = split_entry(encoding)
    base = [f"encoding={name}", "model=tiny", f"train.train_len={train_len}", *overrides]
    with initialize_config_dir(str(conf_dir()), version_base=None):
        cfg = compose("app_train", base)
        if "max_len" in cfg.encoding:
            cfg = compose("app_train", [*base, f"encoding.max_len={max_len}"])
    return build_model(cfg, SHAPE["vocab"])


def _peer_model(encoding: str, flash: bool):
    """x-transformers at posbench's shape: head dimension d_model / heads, rotary over the whole
    head, tied embeddings (5.25M parameters for both at the default shape)."""
    from x_transformers import Decoder, TransformerWrapper

    head_dim = SHAPE["d_model"] // SHAPE["n_heads"]
    rotary = {"rotary_emb_dim": head_dim}
    layers = {"rope": {"rotary_pos_emb": True, **rotary}, "alibi": {"alibi_pos_bias": True},
              "t5": {"rel_pos_bias": True}, "xpos": {"rotary_xpos": True, **rotary}}.get(encoding, {})
    wrapper = {"sinusoidal": {"scaled_sinu_pos_emb": True}, "learned": {}}.get(encoding, {"use_abs_pos_emb": False})
    return TransformerWrapper(num_tokens=SHAPE["vocab"], max_seq_len=16384, tie_embedding=True, **wrapper,
                              attn_layers=Decoder(dim=SHAPE["d_model"], depth=SHAPE["n_layers"], heads=SHAPE["n_heads"],
                                                  attn_dim_head=head_dim, ff_mult=SHAPE["d_ff"] // SHAPE["d_model"],
                                                  attn_flash=flash, **layers))


def _child(spec: dict) -> dict:
    import torch
    import torch.nn.functional as F

    from .model.build import autocast_dtype, keep_freed_memory

    peer = spec["impl"] != "posbench"
    if spec["malloc"] == "posbench":
        keep_freed_memory()
    dev, sync, peak_mb = _device(spec)
    torch.manual_seed(0)
    length = spec["length"]
    model = _peer_model(spec["encoding"], spec["impl"] == "x-transformers flash") if peer else \
        _posbench_model(spec["encoding"], length if spec["kind"] == "train" else 128, max(length, 16384))
    model = model.to(dev)
    dtype = autocast_dtype(dev, "auto")
    amp = torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None)

    def batch(tokens, n):
        return torch.randint(0, SHAPE["vocab"], (max(1, tokens // n), n), device=dev)

    if spec["kind"] == "train":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x, y = batch(spec["tokens"], length), batch(spec["tokens"], length)

        def step():
            with amp:
                loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten()) if peer else model(x, targets=y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        for _ in range(spec["warmup"]):
            step()
        sync()
        start = time.perf_counter()
        for _ in range(spec["steps"]):
            step()
        sync()
        seconds = (time.perf_counter() - start) / spec["steps"]
        tokens = x.numel()
    else:
        model.eval()

        def forward(n):
            x = batch(spec["tokens"], n)
            with torch.no_grad(), amp:
                if peer:
                    model(x)
                else:  # as posbench eval: hidden states, then the NLL in slices
                    model.token_nll(x, x)
            return x.numel()

        forward(1024)  # warm-up: threads, allocator, one-time initialisation
        sync()
        start = time.perf_counter()
        tokens = forward(length)
        sync()
        seconds = time.perf_counter() - start
    return {"tokens_per_s": tokens / seconds, "seconds": seconds, "params": sum(p.numel() for p in model.parameters()),
            "peak_mb": peak_mb()}


def _kernel_child(spec: dict) -> dict:
    """One attention layer at spec['length'] tokens with an ALiBi bias, by kernel."""
    import torch
    import torch.nn.functional as F

    from .model import attention
    from .model.build import autocast_dtype, keep_freed_memory
    from .encodings import ModelDims, build_encoding

    keep_freed_memory()
    dev, sync, peak_mb = _device(spec)
    dtype = autocast_dtype(dev, "auto") or torch.float32  # the precision evaluation runs in
    T, H = spec["length"], SHAPE["n_heads"]
    hs = SHAPE["d_model"] // H
    enc = build_encoding({"name": "alibi"}, ModelDims(SHAPE["d_model"], H, 1, 128)).to(dev)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, T, hs, dtype=dtype, device=dev) for _ in range(3))
    pos = torch.arange(T, device=dev)
    kernel, compile_s = spec["kernel"], None
    if kernel == "sdpa, no bias":
        def run():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    elif kernel == "bias per query chunk":
        def run():
            return attention.sdpa_chunks(q, k, v, 1024, enc.logit_scale(), lambda s, e: attention.masked_bias(
                enc, pos[s:e], pos[:e], 0, q.dtype))
    elif kernel == "Toeplitz slices (posbench)":
        def run():
            return attention.causal_attention(q, k, v, enc, pos, 0, 1024, cache={})
    else:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        slopes = enc.slopes.float()

        def alibi(score, b, h, i, j):
            return score - slopes[h] * (i - j)

        start = time.perf_counter()
        block_mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, T, T, device=dev)
        flex = torch.compile(flex_attention)
        flex(q, k, v, score_mod=alibi, block_mask=block_mask)
        sync()
        compile_s = time.perf_counter() - start

        def run():
            return flex(q, k, v, score_mod=alibi, block_mask=block_mask)
    with torch.no_grad():
        run()
        sync()
        start = time.perf_counter()
        for _ in range(2):
            run()
        sync()
    return {"seconds": (time.perf_counter() - start) / 2, "compile_s": compile_s, "peak_mb": peak_mb()}


def _matmul_child(spec: dict) -> dict:
    """The peak of a 2048^3 matrix product in each of ``spec["dtypes"]``, one process for all."""
    import torch

    dev, sync, _ = _device(spec)
    peaks = {}
    for name in spec["dtypes"]:
        a, b = (torch.randn(2048, 2048, dtype=getattr(torch, name), device=dev) for _ in range(2))
        a @ b  # warm-up: on a GPU, the library's first call
        sync()
        best, begun = math.inf, time.perf_counter()
        for round_ in range(8):  # the best of up to 8 rounds of 4 products: a peak, not an average over noise
            start = time.perf_counter()
            for _ in range(4):
                a @ b
            sync()
            best = min(best, time.perf_counter() - start)
            if round_ >= 2 and time.perf_counter() - begun > 2.0:  # a slow CPU on one thread: 3 rounds or 2 s
                break
        peaks[f"{name}_gflops"] = 4 * 2 * 2048 ** 3 / best / 1e9
    return peaks


# ---- the parent ----------------------------------------------------------------------------

def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_child(spec: dict, timeout: float = 900) -> dict:
    """``spec`` measured in a fresh process -> its figures, or {"error": one line}. On the CPU
    under the address-space cap; on a GPU without it (CUDA reserves more address space)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    cap = _limit_memory if spec.get("device", "cpu") == "cpu" else None
    try:
        done = subprocess.run([sys.executable, "-m", "posbench.bench", "--child", json.dumps(spec)],
                              capture_output=True, text=True, timeout=timeout, preexec_fn=cap, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and lines:
        return json.loads(lines[-1])
    err = done.stderr.strip().splitlines()
    last = err[-1] if err else f"exit {done.returncode}"
    if "memory" in last.lower() or done.returncode == -9:
        return {"error": f"out of memory ({MEMORY_CAP >> 30} GiB cap)"}
    return {"error": last[:200]}


def flops_per_token(train_len: int) -> float:
    d, L, ff, V = SHAPE["d_model"], SHAPE["n_layers"], SHAPE["d_ff"], SHAPE["vocab"]
    matmul_params = L * (4 * d * d + 2 * d * ff) + V * d
    return 6 * matmul_params + 6 * L * d * train_len


def _short(error) -> str:
    """A table cell for a failed measurement (the CSV keeps the whole message)."""
    error = str(error)
    if "memory" in error.lower():
        return "out of memory"
    return error.split(": ", 1)[-1][:60]


def _fmt(value, spec=",.0f"):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, spec)


MALLOCS = ("system", "posbench")  # glibc's default; posbench's (freed memory kept in the heap)


def bench(encodings, train_lens, eval_lens, peer: bool, kernels: bool, steps: int, mallocs=MALLOCS,
          log=print, device: str = "cpu", matmuls: bool = True, tokens: dict | None = None) -> dict:
    """Run every measurement on ``device`` (cpu or cuda); -> {"machine": {...}, "rows": [...],
    "kernels": [...]}. ``matmuls=False`` skips the machine's matmul peaks (``--update`` keeps the
    earlier run's machine figures, so measuring them again would be thrown away). ``tokens``:
    {"train": tokens a step, "eval": tokens a pass} (default 4,096 and 16,384), in every row."""
    import torch

    from .model.build import autocast_dtype
    from .encodings import REGISTRY

    unknown = sorted({split_entry(e)[0] for e in encodings} - set(REGISTRY))
    if unknown:
        from .errors import PosbenchError
        raise PosbenchError(f"unknown encoding(s) {', '.join(unknown)}; valid choices: {', '.join(sorted(REGISTRY))}")
    precision = "bf16" if autocast_dtype(torch.device(device), "auto") is not None else "fp32"
    # bf16 products are emulated, and slow, on a CPU without bf16 instructions: measured only where used
    dtypes = ("float32", "bfloat16") if precision == "bf16" else ("float32",)
    name = torch.cuda.get_device_name() if device == "cuda" else _cpu_name()

    def matmul_peaks() -> dict:  # GFLOP/s of each dtype (nan where not measured or it failed)
        got = run_child({"what": "matmul", "dtypes": list(dtypes), "device": device}) if matmuls else {}
        return {f"{d}_gflops": got.get(f"{d}_gflops", math.nan) for d in dtypes}

    machine = {"cpu": name, "cores": os.cpu_count(), "device": device, "torch": torch.__version__,
               "python": platform.python_version(), "precision": precision, **matmul_peaks()}
    log(f"machine: {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}, {precision}; matmul 2048^3: "
        + (", ".join(f"{d} {machine[f'{d}_gflops']:.0f} GFLOP/s" for d in dtypes) if matmuls else "not measured"))
    impls = ["posbench"] + (["x-transformers", "x-transformers flash"] if peer else [])
    tokens = {**DEFAULT_TOKENS, **(tokens or {})}
    rows = []
    for encoding in encodings:
        for malloc in mallocs:
            for impl in impls:
                if impl != "posbench" and encoding not in PEER_ENCODINGS:
                    continue
                for kind, lengths in (("train", train_lens), ("eval", eval_lens)):
                    for length in lengths:
                        spec = {"what": "model", "encoding": encoding, "impl": impl, "malloc": malloc, "kind": kind,
                                "length": length, "steps": steps, "warmup": 2, "device": device,
                                "tokens": tokens[kind]}
                        got = run_child(spec)
                        rows.append({**spec, **got})
                        figure = got.get("error") or (f"{got['tokens_per_s']:8,.0f} tok/s  {got['peak_mb']:6,.0f} MB")
                        log(f"{encoding:<14} {impl:<22} {malloc:<8} {kind:<5} {length:>6}  {figure}")
    for key, again in matmul_peaks().items():  # again at the end: the higher of the two readings
        machine[key] = max((v for v in (machine[key], again) if v == v), default=math.nan)
    kernel_rows = []
    if kernels:
        for kernel in ("sdpa, no bias", "bias per query chunk", "Toeplitz slices (posbench)", "flex attention"):
            got = run_child({"what": "kernel", "kernel": kernel, "length": 8192, "device": device})
            kernel_rows.append({"kernel": kernel, "length": 8192, **got})
            log(f"kernel {kernel:<28} " + (got.get("error") or f"{got['seconds']:.3f} s/layer"
                                            + (f" (compile {got['compile_s']:.0f} s)" if got.get("compile_s") else "")))
    return {"machine": machine, "rows": rows, "kernels": kernel_rows}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def measured(result: dict):
    """The rows as a DataFrame, with the columns older bench.json files lack: ``malloc`` (there,
    posbench ran under its own setting and the peer under ``machine.peer_malloc``), ``params`` and
    ``tokens`` (a step or a pass; there, the defaults)."""
    import pandas as pd

    df = pd.DataFrame(result["rows"])
    for col in ("tokens_per_s", "peak_mb", "error", "params", "seconds"):
        if col not in df:
            df[col] = None
    if "malloc" not in df:
        df["malloc"] = None
    peer_malloc = result["machine"].get("peer_malloc", "system")
    df["malloc"] = df.malloc.fillna(df.impl.map(lambda impl: "posbench" if impl == "posbench" else peer_malloc))
    defaults = df.kind.map(DEFAULT_TOKENS)  # rows from before --train-tokens / --eval-tokens ran with the defaults
    df["tokens"] = defaults if "tokens" not in df else df.tokens.fillna(defaults)
    return df


def _pick(df, enc, malloc, kind, length, peer: bool):
    """posbench's row, or the faster x-transformers row (attn_flash on or off), or None."""
    rows = df[(df.encoding == enc) & (df.malloc == malloc) & (df.kind == kind) & (df.length == length)
              & ((df.impl != "posbench") if peer else (df.impl == "posbench"))]
    fast = rows[rows.tokens_per_s.notna()]
    if len(fast):
        return fast.loc[fast.tokens_per_s.idxmax()]
    return rows.iloc[0] if len(rows) else None


def _tps(row):
    return None if row is None or row.tokens_per_s is None or row.tokens_per_s != row.tokens_per_s else row.tokens_per_s


def _cell_text(row, value):
    """A figure, or the row's shortened error, or '-' when nothing was measured."""
    if row is None:
        return "-"
    return _fmt(value) if _tps(row) else _short(row.error)


def _params(df, enc, impl_is_peer: bool) -> str:
    rows = df[(df.encoding == enc) & ((df.impl != "posbench") if impl_is_peer else (df.impl == "posbench"))]
    counts = rows.params.dropna()
    return f"{counts.iloc[0] / 1e6:.2f}M" if len(counts) else "-"


def _model_table(df, kind: str, peak_gflops: float) -> list[str]:
    """One line per (encoding, malloc): per length, posbench and x-transformers under that same
    allocator setting and their ratio (training: and posbench's FLOP/s as a fraction of the peak;
    evaluation: and both peak memories)."""
    lengths = sorted(set(df[df.kind == kind].length))
    per = (("tok/s", "x-t", "ratio", "FLOP/s of peak") if kind == "train"
           else ("tok/s", "MB", "x-t tok/s", "x-t MB", "ratio"))
    head = ["encoding", "malloc", "params", "x-t params"] + [f"{x} {'T=' if kind == 'train' else ''}{n}"
                                                             for n in lengths for x in per]
    counts = ", ".join(f"{int(n):,}" for n in sorted(set(df[df.kind == kind].tokens)))
    out = [f"### {'Training' if kind == 'train' else 'Evaluation'}", "",
           f"{counts} tokens {'a step' if kind == 'train' else 'a pass'}.", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for enc in sorted(set(df.encoding)):
        for malloc in [m for m in MALLOCS if m in set(df.malloc)]:
            cells = [enc, malloc, _params(df, enc, False), _params(df, enc, True)]
            for n in lengths:
                ours, theirs = _pick(df, enc, malloc, kind, n, False), _pick(df, enc, malloc, kind, n, True)
                ratio = f"{_tps(ours) / _tps(theirs):.2f}" if _tps(ours) and _tps(theirs) else "-"
                if kind == "train":
                    frac = f"{_tps(ours) * flops_per_token(n) / (peak_gflops * 1e9):.0%}" if _tps(ours) else "-"
                    cells += [_cell_text(ours, _tps(ours)), _cell_text(theirs, _tps(theirs)), ratio, frac]
                else:
                    cells += [_cell_text(ours, _tps(ours)), _fmt(None if ours is None else ours.peak_mb),
                              _cell_text(theirs, _tps(theirs)), _fmt(None if theirs is None else theirs.peak_mb), ratio]
            out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def tables(result: dict) -> str:
    """bench.md: machine, training table, evaluation table, kernels, targets."""
    machine, df = result["machine"], measured(result)
    precision = machine.get("precision", "bf16")
    peak = machine["bfloat16_gflops" if precision == "bf16" else "float32_gflops"]
    peaks = ", ".join(f"{name} {machine[f'{d}_gflops']:.0f} GFLOP/s" for d, name in (("float32", "fp32"), ("bfloat16", "bf16"))
                      if f"{d}_gflops" in machine)
    gpu = machine.get("device") == "cuda"
    where = f"GPU {machine['cpu']} ({machine['cores']} host cores)" if gpu else f"{machine['cpu']}, {machine['cores']} cores"
    autocast = " autocast" if precision == "bf16" else f" (no bf16 autocast on this {'GPU' if gpu else 'CPU'})"
    out = [f"Machine: {where}, torch {machine['torch']}. Matmul 2048^3: {peaks}."
           + (" Peak MB: the GPU's allocated memory (torch.cuda.max_memory_allocated)." if gpu else ""),
           "", f"Model: {SHAPE['n_layers']} layers, d_model {SHAPE['d_model']}, {SHAPE['n_heads']} heads, "
           f"FFN {SHAPE['d_ff']}, vocabulary {SHAPE['vocab']}; {precision}{autocast}. x-transformers (x-t): the "
           "faster of attn_flash off/on per cell, at posbench's head dimension with tied embeddings; each ratio "
           "compares the two under the same allocator setting (malloc: glibc's default `system`, or posbench's "
           f"`posbench`). FLOP/s against the {precision} matmul peak.", ""]
    out += _model_table(df, "train", peak) + _model_table(df, "eval", peak)
    if result["kernels"]:
        out += [f"### Attention kernels: one ALiBi layer at 8,192 tokens ({precision}, no grad)", "",
                "| kernel | s/layer | compile s | peak MB |", "|---|---|---|---|"]
        for k in result["kernels"]:
            out.append(f"| {k['kernel']} | {k.get('error') or format(k['seconds'], '.3f')} | "
                       f"{_fmt(k.get('compile_s'), '.0f')} | {_fmt(k.get('peak_mb'))} |")
        out.append("")
    out += ["### Targets", ""] + [f"- {line}" for line in targets(df)]
    return "\n".join(out) + "\n"


def targets(df) -> list[str]:
    """The performance issue's targets, each with the figures it is judged on: posbench's own
    figures under its default allocator setting, and each training ratio under equal settings."""
    lines = []
    if "malloc" not in df:
        df = df.assign(malloc="posbench")
    own = "posbench" if (df[df.impl == "posbench"].malloc == "posbench").any() else "system"
    ev = df[(df.kind == "eval") & (df.impl == "posbench") & (df.malloc == own)]
    longest = ev.length.max() if len(ev) else None
    if longest:
        at = ev[ev.length == longest]
        worst = at.loc[at.peak_mb.idxmax()] if at.peak_mb.notna().any() else None
        failed = at[at.tokens_per_s.isna()]
        ok = worst is not None and worst.peak_mb < 2048 and failed.empty
        lines.append(f"{'met' if ok else 'NOT met'}: every encoding evaluates at {longest:,} tokens under 2 GB peak"
                     + (f" (highest: {worst.encoding} {worst.peak_mb:,.0f} MB)" if worst is not None else "")
                     + (f"; failed: {', '.join(failed.encoding)}" if len(failed) else ""))

    def seconds(enc, n):
        r = ev[(ev.encoding == enc) & (ev.length == n)]
        return r.seconds.iloc[0] if len(r) and r.seconds.notna().iloc[0] else None

    for enc in ("alibi", "t5"):
        mine, rope = seconds(enc, 8192), seconds("rope", 8192)
        if mine and rope:
            lines.append(f"{'met' if mine <= 2 * rope else 'NOT met'}: {enc} evaluation at 8,192 tokens within 2x of "
                         f"rope's time ({mine:.2f} s vs {rope:.2f} s, {mine / rope:.2f}x)")
    tr = df[df.kind == "train"]
    for malloc in [m for m in MALLOCS if m in set(tr.malloc)]:
        for enc in ("rope", "alibi", "t5"):
            for n in sorted(set(tr.length)):
                ours, theirs = _pick(tr, enc, malloc, "train", n, False), _pick(tr, enc, malloc, "train", n, True)
                if _tps(ours) and _tps(theirs):
                    ratio = _tps(ours) / _tps(theirs)
                    lines.append(f"{'met' if ratio >= 1.3 else 'NOT met'}: {enc} training at T={n} >= 1.3x "
                                 f"x-transformers, both under malloc={malloc} ({_tps(ours):,.0f} vs "
                                 f"{_tps(theirs):,.0f} tok/s, {ratio:.2f}x)")
    return lines


def main(argv: list[str] | None = None) -> None:
    from .encodings import REGISTRY

    parser = argparse.ArgumentParser(prog="posbench bench", description=__doc__.splitlines()[0])
    parser.add_argument("--encodings", nargs="+", default=[*sorted(REGISTRY), *MODEL_OPTION_ENTRIES], metavar="NAME",
                        help="default: all, and each model option with one encoding; NAME+KEY=VALUE adds a config "
                             "override, e.g. nope+model.length_scaling=ssmax")
    parser.add_argument("--train-lens", nargs="*", type=int, default=[128, 512], metavar="T")
    parser.add_argument("--eval-lens", nargs="+", type=int, default=[1024, 4096, 8192, 16384], metavar="L")
    parser.add_argument("--steps", type=int, default=8, help="timed training steps per figure (after 2 warm-up steps)")
    parser.add_argument("--train-tokens", type=int, default=TRAIN_TOKENS, metavar="N",
                        help=f"tokens a training step (default {TRAIN_TOKENS}: batch = N / train length)")
    parser.add_argument("--eval-tokens", type=int, default=EVAL_TOKENS, metavar="N",
                        help=f"tokens an evaluation pass (default {EVAL_TOKENS}: batch = N / length)")
    parser.add_argument("--no-peer", action="store_true", help="leave out x-transformers")
    parser.add_argument("--kernels", action="store_true", help="also compare attention kernels (flex attention compiles)")
    parser.add_argument("--malloc", nargs="+", choices=MALLOCS, default=None,
                        help="allocator settings every implementation is measured under (default: both on the CPU, "
                             "system on a GPU): glibc's default (system) and posbench's, freed memory kept in the "
                             "heap (posbench)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the models run (default: cpu); cuda: the first visible GPU")
    parser.add_argument("--update", action="store_true",
                        help="re-measure --encodings at the lengths given and replace those rows in --out's "
                             "bench.json (other rows, machine figures and kernels kept unless --kernels)")
    parser.add_argument("--out", default="results/bench", help="where bench.csv, bench.json and bench.md go")
    ns = parser.parse_args(argv)
    peer = not ns.no_peer
    if ns.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            from .errors import PosbenchError
            raise PosbenchError("posbench bench --device cuda: no CUDA GPU is visible here; valid here: --device cpu")
    mallocs = ns.malloc or (list(MALLOCS) if ns.device == "cpu" else ["system"])
    if peer:
        try:
            import x_transformers  # noqa: F401
        except ImportError:
            from .errors import PosbenchError
            raise PosbenchError('x-transformers is not installed; valid: pip install -e ".[bench]", or --no-peer')
    out = Path(ns.out)
    if ns.update and not (out / "bench.json").is_file():
        from .errors import PosbenchError
        raise PosbenchError(f"--update needs an earlier run's {out / 'bench.json'}; valid: run posbench bench "
                            f"--out {out} first, or leave out --update")
    for flag, value, least in (("--train-tokens", ns.train_tokens, max(ns.train_lens, default=1)),
                               ("--eval-tokens", ns.eval_tokens, max(ns.eval_lens))):
        if value < least:
            from .errors import PosbenchError
            raise PosbenchError(f"posbench bench {flag} {value}: fewer tokens than one window of {least}; valid: "
                                f"an integer >= {least}")
    result = bench(ns.encodings, ns.train_lens, ns.eval_lens, peer, ns.kernels, ns.steps, mallocs, device=ns.device,
                   matmuls=not ns.update, tokens={"train": ns.train_tokens, "eval": ns.eval_tokens})
    if ns.update:
        old = json.loads((out / "bench.json").read_text())
        old["rows"] = measured(old).to_dict("records")  # older files: the allocator of each row
        key = ("encoding", "impl", "malloc", "kind", "length")
        fresh = {tuple(r[k] for k in key) for r in result["rows"]}
        result = {"machine": old["machine"], "kernels": result["kernels"] or old["kernels"],
                  "rows": [r for r in old["rows"] if tuple(r[k] for k in key) not in fresh] + result["rows"]}
    from .runs.rundir import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    text = tables(result)
    atomic_write_text(out / "bench.csv", measured(result).to_csv(index=False))  # every column, errors or none
    atomic_write_text(out / "bench.json", json.dumps(result, indent=1))
    atomic_write_text(out / "bench.md", text)
    print("\n" + text)
    print(f"wrote {out / 'bench.md'}, {out / 'bench.csv'}, {out / 'bench.json'}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        spec = json.loads(sys.argv[2])
        child = {"model": _child, "kernel": _kernel_child, "matmul": _matmul_child}[spec["what"]]
        print(json.dumps(child(spec)), flush=True)
    else:
        main()
