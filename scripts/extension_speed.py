"""One attention layer under each training-free extension, by its two CPU paths, side by side.

STRING, attention sinks, LM-Infinite and Dual Chunk Attention are computed from their parts
(:meth:`posbench.encodings.extension.Extension.parts`). On the CPU each part of a block of queries
can be one call of the fused flash kernel, merged with the others by log-sum-exp
(``fused=True``, the default), or a block of scores materialised, masked and normalised
(``fused=False``, :func:`posbench.encodings.extension.parts_attention`, the path every device
has). Self-Extend and ReRoPE have their own two fused calls (and the same query chunks when
``fused=False``); the model as trained (``none``) is one causal ``scaled_dot_product_attention``.

Shapes are SmolLM2-135M's attention (9 query heads of 64 on 3 KV heads, trained context 8,192)
on random q, k, v, each method at its reference's defaults for that context (Self-Extend and ReRoPE,
which have none, at the SmolLM2 study's W = 2,048, G = 8); one window of
``--length`` tokens. Prints, and writes with --out, each path's seconds, the ratio unfused / fused,
each method's fused time over the plain causal attention's, and the largest difference between
the two paths' outputs. Run it alone and beside a busy process (``scripts/contention.py`` says
why); ratios are what carries between machines.

    python scripts/extension_speed.py --length 16384 --out results/bench/extension_speed.md
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from posbench.encodings.extension import Extension, extended_attention

METHODS = ("self_extend", "rerope", "string", "sinks", "lm_infinite", "dca")
CONTEXT, HEADS, KV_HEADS, HS = 8192, 9, 3, 64
STUDY = {"self_extend": (2048, 8), "rerope": (2048, None)}  # (W, G) as conf/study/smollm2.yaml sets them


def seconds(fn) -> tuple[float, torch.Tensor]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=16384, help="tokens in the window (default 16384: 2x context)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--label", default="", help="a note for the table's header (e.g. 'beside a busy process')")
    parser.add_argument("--out", type=Path, help="append the table to this markdown file")
    args = parser.parse_args()
    torch.manual_seed(0)
    T = args.length
    q = torch.randn(1, HEADS, T, HS)
    k, v = torch.randn(1, KV_HEADS, T, HS), torch.randn(1, KV_HEADS, T, HS)
    inv_freq = 100000.0 ** (-torch.arange(0, HS, 2, dtype=torch.float32) / HS)
    scale = HS ** -0.5
    plain, _ = seconds(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True))
    lines = [f"## One attention layer at {T:,} tokens ({HEADS} heads of {HS} on {KV_HEADS} KV heads, context "
             f"{CONTEXT:,}){' ' + args.label if args.label else ''}",
             "", f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
             f"{torch.__version__}, {torch.get_num_threads()} threads; plain causal attention {plain:.2f} s", "",
             "| method | fused s | unfused s | unfused / fused | fused / plain | max abs diff |",
             "|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for method in args.methods:
        ext = Extension(method, *STUDY.get(method, (None, None)), train_len=CONTEXT)
        fused_s, fused = seconds(lambda: extended_attention(q, k, v, inv_freq, ext, scale, fused=True))
        unfused_s, unfused = seconds(lambda: extended_attention(q, k, v, inv_freq, ext, scale, fused=False))
        diff = float((fused - unfused).abs().max())
        line = (f"| {ext.label} | {fused_s:.2f} | {unfused_s:.2f} | {unfused_s / fused_s:.2f} | "
                f"{fused_s / plain:.2f} | {diff:.1e} |")
        lines.append(line)
        print(line, flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            f.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
