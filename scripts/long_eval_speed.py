"""Long evaluation on one device: posbench's ladder against a plain transformers forward, in
seconds, tokens/s and peak memory, at lengths to 32k.

Two subjects, each scored at every length ``--lengths`` on the same ``--tokens`` random token ids
(the same ids at every length and for both paths; speed and memory do not depend on the text),
one window a call where a window is ``--batch-tokens`` or longer:

* **pretrained**: random weights of a real model's shape (``--shape``; ``llama-1b`` is Llama 3.2
  1B's config: 16 layers, d_model 2,048, 32 query and 8 key-value heads, SwiGLU 8,192, 128,256
  tokens, RoPE base 500,000 with its llama3 scaling from 8,192 positions, tied embeddings), built
  by transformers in ``--dtype``. **plain** is what a one-off perplexity script does
  (jquesnelle/yarn's ``eval/perplexity.py``): ``model(input_ids=window).logits``, then the fp32
  cross entropy of the whole window. **posbench** is ``posbench eval pretrained=``'s loop on the
  same model object (:class:`posbench.model.pretrained.PretrainedLM` around it,
  :func:`posbench.eval.ladder.window_nll`): the body's hidden states, then the head a few thousand
  rows at a time, so a window's (L, vocabulary) logits never exist at once. Both paths score the
  same weights, so their mean NLLs are printed side by side (equal up to the dtype's rounding).
* **trained**: the shape of a trained run (``--run-model`` preset, rope, ``--run-train-len``; its
  random weights through ``posbench eval``'s loop, fp32 weights under bf16 autocast on a GPU as
  ``posbench eval`` runs them) against a transformers Llama of the same depth, width, heads and
  vocabulary in ``--dtype`` through the plain forward. posbench's FFN is a GELU MLP of two
  matrices (d_ff); the Llama's is SwiGLU of three, given 2/3 of d_ff, so both spend the same FLOPs
  a token. Their NLLs differ (different weights): only time and memory compare.

Peak memory is the device's allocator peak of each measurement (``torch.cuda.max_memory_allocated``
after a reset), weights included; on a CPU it is not measured per row ("-"). Each path is warmed
up once at the shortest length before its timed rows. Rows are appended to ``long_eval.csv`` as
each finishes and skipped when there, so the same command resumes; ``long_eval.md`` is rewritten
from the CSV after each row. A path that runs out of memory at a length gets a row saying so.

On one GPU (about a minute on an H100):

    python scripts/long_eval_speed.py --device cuda --out results/bench/long_eval

On a CPU, the same code at a toy shape (the tests run it so):

    python scripts/long_eval_speed.py --device cpu --shape tiny --run-model tiny --lengths 64 128 \\
        --run-lengths 64 128 --run-train-len 16 --tokens 256 --dtype fp32 --out /tmp/long_eval
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from pathlib import Path

import pandas as pd

#: transformers LlamaConfig keywords of each ``--shape``
SHAPES = {
    "llama-1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
                 "max_position_embeddings": 131072, "tie_word_embeddings": True, "rms_norm_eps": 1e-5,
                 "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 8192}},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512, "max_position_embeddings": 4096,
             "tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
}
COLUMNS = ["subject", "path", "length", "windows", "tokens", "seconds", "tokens_per_s", "peak_mb", "nll", "note"]
DTYPES = ("bf16", "fp32")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="bf16", choices=DTYPES, help="the transformers models' weights (default bf16)")
    p.add_argument("--shape", default="llama-1b", choices=sorted(SHAPES), help="the pretrained subject's shape")
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    p.add_argument("--run-model", default="base", help="the trained subject's model preset (conf/model/NAME.yaml)")
    p.add_argument("--run-train-len", type=int, default=512)
    p.add_argument("--run-lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--tokens", type=int, default=131072, help="scored tokens at every length (a multiple of each)")
    p.add_argument("--batch-tokens", type=int, default=16384, help="tokens a forward pass (posbench eval's default)")
    p.add_argument("--subjects", nargs="+", default=["pretrained", "trained"], choices=("pretrained", "trained"))
    p.add_argument("--out", type=Path, default=Path("results/bench/long_eval"))
    return p


class Meter:
    """Seconds and the allocator's peak of one measurement on ``device``."""

    def __init__(self, device):
        import torch

        self.torch, self.device, self.cuda = torch, device, device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
            self.torch.cuda.reset_peak_memory_stats(self.device)
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
        self.seconds = time.perf_counter() - self.start
        self.peak_mb = self.torch.cuda.max_memory_allocated(self.device) / 2 ** 20 if self.cuda else math.nan
        return False


def llama(keywords: dict, dtype, device):
    """A transformers LlamaForCausalLM of ``keywords`` with random weights, in eval mode."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**keywords)
    return transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def posbench_path(model, ids, length: int, batch_tokens: int, device, dtype) -> float:
    """Mean NLL of posbench's ladder loop over windows of ``length`` side by side."""
    from posbench.eval.ladder import window_nll

    sums, _, _ = window_nll(model, ids, length, length, batch_tokens, device, dtype)
    return float(sums.sum()) / (ids.numel() - 1)


def subjects(ns, device, dtype) -> dict:
    """-> {subject: (lengths, build)}; ``build()`` -> (vocabulary, {path: callable(ids, length) -> mean
    NLL}), called only for a subject with rows to measure."""
    from posbench.model.build import autocast_dtype
    from posbench.model.pretrained import plain_nll

    amp = autocast_dtype(device, "bf16" if ns.dtype == "bf16" else "fp32")

    def pretrained():
        from posbench.model.pretrained import PretrainedLM

        model = llama(SHAPES[ns.shape], dtype, device)
        wrapped = PretrainedLM(model, f"random {ns.shape}", ns.shape).to(device)
        return SHAPES[ns.shape]["vocab_size"], {
            "plain": lambda ids, n: plain_nll(model, ids, n),
            "posbench": lambda ids, n: posbench_path(wrapped, ids, n, ns.batch_tokens, device, amp)}

    def trained():
        from posbench.bench.children import VOCAB, _posbench_model, model_shape

        shape = model_shape(ns.run_model)
        ours = _posbench_model("rope", ns.run_train_len, max(ns.run_lengths), ns.run_model).to(device).eval()
        peer = llama({"hidden_size": shape["d_model"], "intermediate_size": 2 * shape["d_ff"] // 3,
                      "num_hidden_layers": shape["n_layers"], "num_attention_heads": shape["n_heads"],
                      "num_key_value_heads": shape["n_heads"], "vocab_size": VOCAB,
                      "max_position_embeddings": max(ns.run_lengths), "tie_word_embeddings": True,
                      "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}, dtype, device)
        return VOCAB, {"plain": lambda ids, n: plain_nll(peer, ids, n),
                       "posbench": lambda ids, n: posbench_path(ours, ids, n, ns.batch_tokens, device, amp)}

    return {"pretrained": (ns.lengths, pretrained), "trained": (ns.run_lengths, trained)}


def measure(ns) -> list[dict]:
    """Every (subject, path, length) row the CSV lacks, appended as each finishes."""
    import torch

    device = torch.device(ns.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[ns.dtype]
    csv = ns.out / "long_eval.csv"
    done = pd.read_csv(csv) if csv.exists() else pd.DataFrame(columns=COLUMNS)
    have = {(r.subject, r.path, int(r.length)) for r in done.itertuples()}
    table = subjects(ns, device, dtype)
    rows = done.to_dict("records")
    for subject in ns.subjects:
        lengths, build = table[subject]
        todo = [(path, n) for path in ("plain", "posbench") for n in lengths if (subject, path, n) not in have]
        if not todo:
            continue
        vocab, paths = build()
        ids = torch.randint(0, vocab, (ns.tokens + 1,), generator=torch.Generator().manual_seed(0)).to(device)
        warm = set()
        with torch.no_grad():
            for path, n in todo:
                if path not in warm:  # kernels chosen, allocator grown: not in any timed row
                    paths[path](ids[:min(lengths) + 1], min(lengths))
                    warm.add(path)
                row = {"subject": subject, "path": path, "length": n, "windows": ns.tokens // n,
                       "tokens": ns.tokens, "note": ""}
                try:
                    with Meter(device) as m:
                        row["nll"] = paths[path](ids, n)
                    row |= {"seconds": m.seconds, "tokens_per_s": ns.tokens / m.seconds, "peak_mb": m.peak_mb}
                except torch.OutOfMemoryError as e:
                    row |= {"seconds": math.nan, "tokens_per_s": math.nan, "peak_mb": math.nan, "nll": math.nan,
                            "note": "out of memory: " + str(e).splitlines()[0][:120]}
                    torch.cuda.empty_cache()
                rows.append(row)
                pd.DataFrame(rows, columns=COLUMNS).to_csv(csv, index=False)
                write_markdown(ns, rows)
                print(f"long_eval: {subject} {path} L={n}: " + (row["note"] or
                      f"{row['seconds']:.2f} s, {row['tokens_per_s']:,.0f} tokens/s, NLL {row['nll']:.4f}"),
                      flush=True)
        del paths  # the subject's models, before the next one's
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _mb(value) -> str:
    return "-" if pd.isna(value) else f"{value:,.0f}"


def write_markdown(ns, rows: list[dict]) -> None:
    """long_eval.md: per subject and length the two paths side by side, and the command."""
    import torch

    df = pd.DataFrame(rows, columns=COLUMNS)
    device = torch.cuda.get_device_name() if ns.device == "cuda" else (platform.processor() or platform.machine())
    args = " ".join(sys.argv[1:]) if Path(sys.argv[0]).name == "long_eval_speed.py" else ""
    lines = [f"# Long evaluation: posbench's ladder against a plain transformers forward ({ns.device})", "",
             f"Device: {device}; torch {torch.__version__}; transformers weights {ns.dtype}; "
             f"{ns.tokens:,} random token ids scored at every length, one run each (no interval).",
             f"Command: `python scripts/long_eval_speed.py {args}`".rstrip(), "",
             "The script's docstring says what each path runs. Peak: the allocator's peak of the row, "
             "weights included (- on a CPU).", ""]
    for subject, what in (("pretrained", f"random weights of `{ns.shape}`'s shape"),
                          ("trained", f"`model={ns.run_model}` rope at train_len {ns.run_train_len} "
                                      "against a transformers Llama of its shape")):
        part = df[df.subject == subject]
        if part.empty:
            continue
        lines += [f"## {subject}: {what}", "",
                  "| L | windows | plain s | posbench s | plain tokens/s | posbench tokens/s | posbench / plain "
                  "speed | plain peak MB | posbench peak MB | plain NLL | posbench NLL |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for n, g in part.groupby("length"):
            r = {p: g[g.path == p].iloc[0] if (g.path == p).any() else None for p in ("plain", "posbench")}
            cell = lambda p, k, f: "-" if r[p] is None else (r[p]["note"][:14] if r[p]["note"] else f(r[p][k]))  # noqa: E731
            ratio = "-" if any(v is None or v["note"] for v in r.values()) else \
                f"{r['posbench']['tokens_per_s'] / r['plain']['tokens_per_s']:.2f}"
            lines.append(f"| {n} | {g.windows.iloc[0]} | {cell('plain', 'seconds', '{:.2f}'.format)} | "
                         f"{cell('posbench', 'seconds', '{:.2f}'.format)} | "
                         f"{cell('plain', 'tokens_per_s', '{:,.0f}'.format)} | "
                         f"{cell('posbench', 'tokens_per_s', '{:,.0f}'.format)} | {ratio} | "
                         f"{cell('plain', 'peak_mb', _mb)} | {cell('posbench', 'peak_mb', _mb)} | "
                         f"{cell('plain', 'nll', '{:.4f}'.format)} | {cell('posbench', 'nll', '{:.4f}'.format)} |")
        lines.append("")
    (ns.out / "long_eval.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    for subject, lengths in (("pretrained", ns.lengths), ("trained", ns.run_lengths)):
        bad = [n for n in lengths if ns.tokens % n]
        if subject in ns.subjects and bad:
            print(f"long_eval_speed: --tokens {ns.tokens} is not a multiple of the {subject} length(s) "
                  f"{', '.join(map(str, bad))}; valid: a multiple of {math.lcm(*lengths)}", file=sys.stderr)
            return 2
    if ns.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("long_eval_speed: --device cuda, but torch sees no CUDA device; valid: --device cpu",
                  file=sys.stderr)
            return 2
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("long_eval_speed: needs transformers (pip install transformers)", file=sys.stderr)
        return 2
    ns.out.mkdir(parents=True, exist_ok=True)
    measure(ns)
    print(f"long_eval: {ns.out / 'long_eval.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
