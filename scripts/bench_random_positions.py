"""The ordinary path (positions 0..T-1) at a base commit and at this checkout, and what
randomized positions cost here, interleaved so that every variant sees the same machine load.

Times, for each encoding: one training step (forward, backward, AdamW) of TRAIN_BATCH windows
of --train-len tokens, and one no-grad evaluation pass (``token_nll``, as ``posbench eval``)
of EVAL_BATCH windows of --eval-len tokens, both past ``model.attn_chunk`` (1024) so relative
biases take the Toeplitz slices. Model: ``model=tiny`` (4 layers, d_model 256, 8 heads, FFN
1024, vocabulary 8192), bf16 autocast where the CPU has it. Variants:

* ``base``: the base commit, checked out in a temporary git worktree;
* ``head``: this checkout, positions 0..T-1;
* ``random``: this checkout, sorted random positions from [0, --max-position) (one draw
  per pass, :func:`posbench.encodings.randomized.random_positions`).

Each measurement runs in its own child process (one torch thread, warm-up first, the median
of --steps timed repetitions); a round runs every variant of every (encoding, kind) back to
back, the order of the variants rotating from round to round. Prints (and writes with --out)
the median over --rounds rounds and the ratios head / base and random / head.

    python scripts/bench_random_positions.py BASE_COMMIT [--rounds 5] [--variants base head random] [--out table.md]

results/bench/random_positions.md holds two such runs with the machine they ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENCODINGS = ("alibi", "t5")
VARIANTS = ("base", "head", "random")
TRAIN_BATCH, EVAL_BATCH, VOCAB = 1, 1, 8192


def child(spec: dict) -> dict:
    """Inside a child whose PYTHONPATH is the tree to measure: seconds per pass, median of the reps."""
    import torch

    import posbench
    from posbench.model.build import autocast, autocast_dtype, keep_freed_memory
    from posbench.encodings import build_encoding
    from posbench.model.transformer import LanguageModel, ModelConfig

    torch.set_num_threads(1)
    keep_freed_memory()
    torch.manual_seed(0)
    cfg, length = ModelConfig(), spec["length"]
    model = LanguageModel(cfg, VOCAB, build_encoding({"name": spec["encoding"]}, LanguageModel.dims(cfg, 128, VOCAB)))
    amp = autocast(torch.device("cpu"), autocast_dtype(torch.device("cpu"), "auto"))
    x = torch.randint(0, VOCAB, (TRAIN_BATCH if spec["kind"] == "train" else EVAL_BATCH, length))
    extra = {}
    if spec["variant"] == "random":
        from posbench.data.positions import random_positions

        extra = {"positions": random_positions(length, spec["max_position"], torch.Generator().manual_seed(0))}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def once():
        if spec["kind"] == "train":
            with amp:
                loss = model(x, targets=x, **extra)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            with torch.no_grad(), amp:
                model.token_nll(x, x, **extra)

    model.train(spec["kind"] == "train")
    once()  # warm-up
    seconds = []
    for _ in range(spec["steps"]):
        start = time.perf_counter()
        once()
        seconds.append(time.perf_counter() - start)
    return {"seconds": statistics.median(seconds), "source": posbench.__file__}


def measure(spec: dict, trees: dict) -> float:
    env = {**os.environ, "PYTHONPATH": str(trees[spec["variant"]]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env, cwd=trees[spec["variant"]],
                          capture_output=True, text=True, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["source"].startswith(str(trees[spec["variant"]])), result  # the tree asked for
    return result["seconds"]


def rounds(ns, trees: dict) -> dict:
    """{(encoding, kind, variant): [seconds per round]}, variants interleaved within each round."""
    times: dict = {}
    for r in range(ns.rounds):
        n = len(ns.variants)
        order = ns.variants[r % n:] + ns.variants[:r % n]
        for encoding in ENCODINGS:
            for kind, length in (("train", ns.train_len), ("eval", ns.eval_len)):
                for variant in order:
                    spec = {"encoding": encoding, "kind": kind, "length": length, "variant": variant,
                            "steps": ns.steps, "max_position": ns.max_position}
                    times.setdefault((encoding, kind, variant), []).append(measure(spec, trees))
                    print(f"round {r + 1}/{ns.rounds} {encoding} {kind} {variant}: "
                          f"{times[(encoding, kind, variant)][-1]:.3f} s", file=sys.stderr)
    return times


RATIOS = (("head", "base"), ("random", "head"))


def table(times: dict, ns) -> str:
    """Median seconds of each variant, and each ratio as the median of its per-round ratios (their
    range in brackets): the variants of a round ran back to back, under about the same load."""
    ratios = [(a, b) for a, b in RATIOS if a in ns.variants and b in ns.variants]
    header = ["encoding", "pass", "T"] + [f"{v} s" for v in ns.variants] + [f"{a} / {b}" for a, b in ratios]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for encoding in ENCODINGS:
        for kind, length in (("train", ns.train_len), ("eval", ns.eval_len)):
            got = {v: times[(encoding, kind, v)] for v in ns.variants}
            cells = [encoding, kind, str(length)] + [f"{statistics.median(got[v]):.3f}" for v in ns.variants]
            for a, b in ratios:
                per_round = [x / y for x, y in zip(got[a], got[b])]
                cells.append(f"{statistics.median(per_round):.3f} ({min(per_round):.2f}-{max(per_round):.2f})")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2, help="timed repetitions per child (after one warm-up)")
    parser.add_argument("--train-len", type=int, default=2048)
    parser.add_argument("--eval-len", type=int, default=4096)
    parser.add_argument("--max-position", type=int, default=16384, help="L of the random variant")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--out", help="also write the table here (Markdown)")
    ns = parser.parse_args()
    base = subprocess.run(["git", "rev-parse", "--short", ns.base], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--quiet", "--detach", str(tree), base], cwd=ROOT, check=True)
        try:
            times = rounds(ns, {"base": tree, "head": ROOT, "random": ROOT})
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    text = table(times, ns)
    print(text)
    print(json.dumps({f"{e} {k} {v}": s for (e, k, v), s in times.items()}))
    if ns.out:
        Path(ns.out).write_text(text)


if __name__ == "__main__":
    main()
