"""`posbench bench`: training and evaluation speed and memory of every encoding, beside a peer.

Every figure comes from one run on one machine, each measurement in its own child process
so that its peak resident memory (``ru_maxrss``: Python, torch, model and activations) is
its own. The model is the benchmark shape of the performance issue: 4 layers, d_model 256,
8 heads, FFN 1024, vocabulary 8192 (``model=tiny``), bf16 autocast where the CPU has it.

* **train**: tokens/s of full training steps (forward, backward, gradient clipping, AdamW)
  at each train length, 4,096 tokens a step (batch = 4096 / train_len), after warm-up steps;
* **eval**: tokens/s and peak memory of one no-grad forward pass scoring 16,384 tokens
  (batch = 16384 / length windows), the way ``posbench eval`` runs, after a warm-up pass at
  1,024 tokens;
* **peer**: the same figures for x-transformers (``pip install -e ".[bench]"``) where it has
  the encoding, at whichever of its two attention settings (``attn_flash`` on or off) is
  faster, and the ratio posbench / x-transformers. It runs as it does out of the box, with
  glibc's default malloc; ``--peer-malloc posbench`` gives it posbench's setting
  (:func:`posbench.build.keep_freed_memory`) to separate that gain from the kernels';
* **FLOP/s**: training FLOPs per token, 6 N (N = matmul parameters, output layer included)
  plus 6 n_layers d_model T (causal attention, forward and backward), times tokens/s, as a
  fraction of the bf16 matmul peak measured on 2048^3 products in the same run (the best
  round of several, at the start and at the end);
* **kernels** (``--kernels``): one attention layer at 8,192 tokens with an ALiBi bias, by
  kernel: SDPA without bias (the floor), the bias built per query chunk, Toeplitz slices of
  one bias, and flex attention with the bias as ``score_mod`` (compiled; compile time apart).

Children run under a 16 GiB address-space cap, so a kernel that materialises a
(heads, T, T) matrix fails with "out of memory" instead of swapping the machine.
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
MEMORY_CAP = 16 << 30  # bytes of address space per child


# ---- inside a child process --------------------------------------------------------------

def _posbench_model(encoding: str, train_len: int, max_len: int):
    """The benchmark model; a position table (``encoding.max_len``) gets ``max_len`` entries so it
    can run at every measured length, as x-transformers' ``max_seq_len``."""
    from hydra import compose, initialize_config_dir

    from .build import build_model
    from .cli import conf_dir

    with initialize_config_dir(str(conf_dir()), version_base=None):
        cfg = compose("app_train", [f"encoding={encoding}", "model=tiny", f"train.train_len={train_len}"])
        if "max_len" in cfg.encoding:
            cfg = compose("app_train", [f"encoding={encoding}", "model=tiny", f"train.train_len={train_len}",
                                        f"encoding.max_len={max_len}"])
    return build_model(cfg, SHAPE["vocab"])


def _peer_model(encoding: str, flash: bool):
    from x_transformers import Decoder, TransformerWrapper

    layers = {"rope": {"rotary_pos_emb": True}, "alibi": {"alibi_pos_bias": True}, "t5": {"rel_pos_bias": True},
              "xpos": {"rotary_xpos": True}}.get(encoding, {})
    wrapper = {"sinusoidal": {"scaled_sinu_pos_emb": True}, "learned": {}}.get(encoding, {"use_abs_pos_emb": False})
    return TransformerWrapper(num_tokens=SHAPE["vocab"], max_seq_len=16384, **wrapper, attn_layers=Decoder(
        dim=SHAPE["d_model"], depth=SHAPE["n_layers"], heads=SHAPE["n_heads"], ff_mult=SHAPE["d_ff"] // SHAPE["d_model"],
        attn_flash=flash, **layers))


def _child(spec: dict) -> dict:
    import torch
    import torch.nn.functional as F

    from .build import autocast_dtype, keep_freed_memory

    peer = spec["impl"] != "posbench"
    if not peer or spec.get("peer_malloc") == "posbench":
        keep_freed_memory()
    torch.manual_seed(0)
    length = spec["length"]
    model = _peer_model(spec["encoding"], spec["impl"] == "x-transformers flash") if peer else \
        _posbench_model(spec["encoding"], length if spec["kind"] == "train" else 128, max(length, 16384))
    dtype = autocast_dtype(torch.device("cpu"), "auto")
    amp = torch.autocast("cpu", dtype=dtype, enabled=dtype is not None)

    def batch(tokens, n):
        return torch.randint(0, SHAPE["vocab"], (max(1, tokens // n), n))

    if spec["kind"] == "train":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x, y = batch(TRAIN_TOKENS, length), batch(TRAIN_TOKENS, length)

        def step():
            with amp:
                loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten()) if peer else model(x, targets=y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        for _ in range(spec["warmup"]):
            step()
        start = time.perf_counter()
        for _ in range(spec["steps"]):
            step()
        seconds = (time.perf_counter() - start) / spec["steps"]
        tokens = x.numel()
    else:
        model.eval()

        def forward(n):
            x = batch(EVAL_TOKENS, n)
            with torch.no_grad(), amp:
                if peer:
                    model(x)
                else:  # as posbench eval: hidden states, then the NLL in slices
                    model.token_nll(x, x)
            return x.numel()

        forward(1024)  # warm-up: threads, allocator, one-time initialisation
        start = time.perf_counter()
        tokens = forward(length)
        seconds = time.perf_counter() - start
    return {"tokens_per_s": tokens / seconds, "seconds": seconds,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _kernel_child(spec: dict) -> dict:
    """One attention layer at spec['length'] tokens with an ALiBi bias, by kernel."""
    import torch
    import torch.nn.functional as F

    from . import attention
    from .build import keep_freed_memory
    from .encodings import ModelDims, build_encoding

    keep_freed_memory()
    T, H = spec["length"], SHAPE["n_heads"]
    hs = SHAPE["d_model"] // H
    enc = build_encoding({"name": "alibi"}, ModelDims(SHAPE["d_model"], H, 1, 128))
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, T, hs, dtype=torch.bfloat16) for _ in range(3))
    pos = torch.arange(T)
    kernel, compile_s = spec["kernel"], None
    if kernel == "sdpa, no bias":
        def run():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    elif kernel == "bias per query chunk":
        def run():
            return attention._sdpa_chunks(q, k, v, 1024, enc.logit_scale(), lambda s, e: attention._masked_bias(
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
        block_mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, T, T, device="cpu")
        flex = torch.compile(flex_attention)
        flex(q, k, v, score_mod=alibi, block_mask=block_mask)
        compile_s = time.perf_counter() - start

        def run():
            return flex(q, k, v, score_mod=alibi, block_mask=block_mask)
    with torch.no_grad():
        run()
        start = time.perf_counter()
        for _ in range(2):
            run()
    return {"seconds": (time.perf_counter() - start) / 2, "compile_s": compile_s,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _matmul_child(spec: dict) -> dict:
    import torch

    dtype = getattr(torch, spec["dtype"])
    a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
    best = math.inf
    for _ in range(8):  # the best of 8 rounds of 4 products: a peak, not an average over noise
        start = time.perf_counter()
        for _ in range(4):
            a @ b
        best = min(best, time.perf_counter() - start)
    return {"gflops": 4 * 2 * 2048 ** 3 / best / 1e9}


# ---- the parent ----------------------------------------------------------------------------

def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_child(spec: dict, timeout: float = 900) -> dict:
    """``spec`` measured in a fresh process -> its figures, or {"error": one line}."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    try:
        done = subprocess.run([sys.executable, "-m", "posbench.bench", "--child", json.dumps(spec)],
                              capture_output=True, text=True, timeout=timeout, preexec_fn=_limit_memory, env=env)
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


def bench(encodings, train_lens, eval_lens, peer: bool, kernels: bool, steps: int, peer_malloc: str = "system",
          log=print) -> dict:
    """Run every measurement; -> {"machine": {...}, "rows": [...], "kernels": [...]}."""
    import torch

    from .encodings import REGISTRY

    unknown = sorted(set(encodings) - set(REGISTRY))
    if unknown:
        from .errors import PosbenchError
        raise PosbenchError(f"unknown encoding(s) {', '.join(unknown)}; valid choices: {', '.join(sorted(REGISTRY))}")
    machine = {"cpu": _cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
               **{f"{d}_gflops": run_child({"what": "matmul", "dtype": d})["gflops"] for d in ("float32", "bfloat16")}}
    log(f"machine: {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}; matmul 2048^3: "
        f"fp32 {machine['float32_gflops']:.0f} GFLOP/s, bf16 {machine['bfloat16_gflops']:.0f} GFLOP/s")
    impls = ["posbench"] + (["x-transformers", "x-transformers flash"] if peer else [])
    rows = []
    for encoding in encodings:
        for impl in impls:
            if impl != "posbench" and encoding not in PEER_ENCODINGS:
                continue
            for kind, lengths in (("train", train_lens), ("eval", eval_lens)):
                for length in lengths:
                    spec = {"what": "model", "encoding": encoding, "impl": impl, "kind": kind, "length": length,
                            "steps": steps, "warmup": 2, "peer_malloc": peer_malloc}
                    got = run_child(spec)
                    rows.append({**spec, **got})
                    figure = got.get("error") or (f"{got['tokens_per_s']:8,.0f} tok/s  {got['peak_mb']:6,.0f} MB")
                    log(f"{encoding:<14} {impl:<22} {kind:<5} {length:>6}  {figure}")
    for d in ("float32", "bfloat16"):  # again at the end: the higher of the two readings
        machine[f"{d}_gflops"] = max(machine[f"{d}_gflops"], run_child({"what": "matmul", "dtype": d})["gflops"])
    kernel_rows = []
    if kernels:
        for kernel in ("sdpa, no bias", "bias per query chunk", "Toeplitz slices (posbench)", "flex attention"):
            got = run_child({"what": "kernel", "kernel": kernel, "length": 8192})
            kernel_rows.append({"kernel": kernel, "length": 8192, **got})
            log(f"kernel {kernel:<28} " + (got.get("error") or f"{got['seconds']:.3f} s/layer"
                                            + (f" (compile {got['compile_s']:.0f} s)" if got.get("compile_s") else "")))
    return {"machine": {**machine, "peer_malloc": peer_malloc}, "rows": rows, "kernels": kernel_rows}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def tables(result: dict) -> str:
    """bench.md: machine, training table, evaluation table, kernels, targets."""
    import pandas as pd

    machine, df = result["machine"], pd.DataFrame(result["rows"])
    for col in ("tokens_per_s", "peak_mb", "error"):
        if col not in df:
            df[col] = None
    peak = machine["bfloat16_gflops"]
    out = [f"Machine: {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}. "
           f"Matmul 2048^3: fp32 {machine['float32_gflops']:.0f} GFLOP/s, bf16 {machine['bfloat16_gflops']:.0f} GFLOP/s.",
           "", f"Model: {SHAPE['n_layers']} layers, d_model {SHAPE['d_model']}, {SHAPE['n_heads']} heads, "
           f"FFN {SHAPE['d_ff']}, vocabulary {SHAPE['vocab']}; bf16 autocast. x-transformers (x-t): the faster of "
           "attn_flash off/on per cell, "
           + ("with glibc's default malloc, as it runs out of the box." if machine.get("peer_malloc", "system") == "system"
              else "with posbench's malloc setting (freed memory kept in the heap)."), ""]

    def best_peer(enc, kind, length):
        peers = df[(df.encoding == enc) & (df.kind == kind) & (df.length == length) & (df.impl != "posbench")]
        peers = peers[peers.tokens_per_s.notna()]
        return peers.loc[peers.tokens_per_s.idxmax()] if len(peers) else None

    def cell(enc, kind, length):
        r = df[(df.encoding == enc) & (df.kind == kind) & (df.length == length) & (df.impl == "posbench")]
        return r.iloc[0] if len(r) else None

    encodings = sorted(set(df.encoding))
    for kind, lengths in (("train", sorted(set(df[df.kind == "train"].length))),
                          ("eval", sorted(set(df[df.kind == "eval"].length)))):
        if kind == "train":
            head = ["encoding"] + [x for n in lengths for x in (f"tok/s T={n}", f"x-t T={n}", f"ratio T={n}",
                                                                  f"FLOP/s of peak T={n}")]
        else:
            head = ["encoding"] + [x for n in lengths for x in (f"tok/s {n}", f"MB {n}", f"x-t tok/s {n}",
                                                                  f"x-t MB {n}", f"ratio {n}")]
        out += [f"### {'Training' if kind == 'train' else 'Evaluation'}", "", "| " + " | ".join(head) + " |",
                "|" + "---|" * len(head)]
        for enc in encodings:
            cells = [enc]
            for n in lengths:
                ours, theirs = cell(enc, kind, n), best_peer(enc, kind, n)
                ours_tps = None if ours is None or pd.isna(ours.tokens_per_s) else ours.tokens_per_s
                peer_tps = None if theirs is None else theirs.tokens_per_s
                peer_err = df[(df.encoding == enc) & (df.kind == kind) & (df.length == n) & (df.impl != "posbench")]
                peer_txt = _fmt(peer_tps) if theirs is not None else (
                    " / ".join(sorted(set(map(_short, peer_err.error.dropna())))) if len(peer_err) else "-")
                ratio = f"{ours_tps / peer_tps:.2f}" if ours_tps and peer_tps else "-"
                if kind == "train":
                    frac = (f"{ours_tps * flops_per_token(n) / (peak * 1e9):.0%}" if ours_tps else "-")
                    cells += [_fmt(ours_tps) if ours is not None and ours_tps else _short(ours.error) if ours is not None else "-",
                              peer_txt, ratio, frac]
                else:
                    cells += [_fmt(ours_tps) if ours_tps else (_short(ours.error) if ours is not None else "-"),
                              _fmt(None if ours is None else ours.peak_mb), peer_txt,
                              _fmt(None if theirs is None else theirs.peak_mb), ratio]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    if result["kernels"]:
        out += ["### Attention kernels: one ALiBi layer at 8,192 tokens (bf16, no grad)", "",
                "| kernel | s/layer | compile s | peak MB |", "|---|---|---|---|"]
        for k in result["kernels"]:
            out.append(f"| {k['kernel']} | {k.get('error') or format(k['seconds'], '.3f')} | "
                       f"{_fmt(k.get('compile_s'), '.0f')} | {_fmt(k.get('peak_mb'))} |")
        out.append("")
    out += ["### Targets", ""] + [f"- {line}" for line in targets(df)]
    return "\n".join(out) + "\n"


def targets(df) -> list[str]:
    """The performance issue's targets, each with the figures it is judged on."""
    lines = []
    ev = df[(df.kind == "eval") & (df.impl == "posbench")]
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
    for enc in ("rope", "alibi", "t5"):
        for n in sorted(set(tr.length)):
            ours = tr[(tr.encoding == enc) & (tr.length == n) & (tr.impl == "posbench")].tokens_per_s
            peer = tr[(tr.encoding == enc) & (tr.length == n) & (tr.impl != "posbench")].tokens_per_s.max()
            if len(ours) and ours.notna().all() and peer == peer and peer:
                ratio = ours.iloc[0] / peer
                lines.append(f"{'met' if ratio >= 1.3 else 'NOT met'}: {enc} training at T={n} >= 1.3x x-transformers "
                             f"({ours.iloc[0]:,.0f} vs {peer:,.0f} tok/s, {ratio:.2f}x)")
    return lines


def main(argv: list[str] | None = None) -> None:
    from .encodings import REGISTRY

    parser = argparse.ArgumentParser(prog="posbench bench", description=__doc__.splitlines()[0])
    parser.add_argument("--encodings", nargs="+", default=sorted(REGISTRY), metavar="NAME", help="default: all")
    parser.add_argument("--train-lens", nargs="*", type=int, default=[128, 512], metavar="T")
    parser.add_argument("--eval-lens", nargs="+", type=int, default=[1024, 4096, 8192, 16384], metavar="L")
    parser.add_argument("--steps", type=int, default=8, help="timed training steps per figure (after 2 warm-up steps)")
    parser.add_argument("--no-peer", action="store_true", help="leave out x-transformers")
    parser.add_argument("--kernels", action="store_true", help="also compare attention kernels (flex attention compiles)")
    parser.add_argument("--peer-malloc", choices=["system", "posbench"], default="system",
                        help="x-transformers under glibc's default malloc (default) or posbench's setting")
    parser.add_argument("--update", action="store_true",
                        help="re-measure --encodings at the lengths given and replace those rows in --out's "
                             "bench.json (other rows, machine figures and kernels kept unless --kernels)")
    parser.add_argument("--out", default="results/bench", help="where bench.csv, bench.json and bench.md go")
    ns = parser.parse_args(argv)
    peer = not ns.no_peer
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
    result = bench(ns.encodings, ns.train_lens, ns.eval_lens, peer, ns.kernels, ns.steps, ns.peer_malloc)
    if ns.update:
        old = json.loads((out / "bench.json").read_text())
        fresh = {(r["encoding"], r["impl"], r["kind"], r["length"]) for r in result["rows"]}
        result = {"machine": old["machine"], "kernels": result["kernels"] or old["kernels"],
                  "rows": [r for r in old["rows"] if (r["encoding"], r["impl"], r["kind"], r["length"]) not in fresh]
                  + result["rows"]}
    import pandas as pd

    from .checkpoint import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    text = tables(result)
    atomic_write_text(out / "bench.csv", pd.DataFrame(result["rows"]).to_csv(index=False))
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
