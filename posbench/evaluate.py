"""Perplexity at a ladder of lengths, every length scoring exactly the same tokens.

The first ``n * L_max`` validation tokens (n = eval.max_tokens // L_max) are cut into
non-overlapping windows of each length L; window w predicts tokens w*L+1 .. (w+1)*L.
So every length scores tokens 1 .. n*L_max: differences across lengths come from the
context the model sees, not from which tokens were scored.

A rotary model can be evaluated under a RoPE scaling (``eval.rope_scaling``, see
:mod:`posbench.encodings.rotary`) with factor ``eval.rope_factor`` or, when null, s =
max(1, L / train_len) at each length L; rows record both, and ``rope_scaling`` is part of
the row key, so one run's results.csv holds a row per scaling and length.
"""

from __future__ import annotations

import math
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from .build import autocast, autocast_dtype, build_model, resolve_device
from .checkpoint import RunDir, atomic_write_text, load_checkpoint
from .config import EvalConfig, code_version, config_hash, typed
from .data import load_corpus
from .encodings import PositionRangeError
from .encodings.rotary import check_scalable, rope_scaling, scaling_factor
from .errors import PosbenchError
from .model import LanguageModel

KEY = ["encoding", "rope_scaling", "train_len", "eval_len", "seed", "split"]


def scored_tokens(tokens: np.ndarray, lengths: list[int], max_tokens: int, split: str) -> int:
    """How many tokens every length scores: a multiple of the longest length."""
    longest = max(lengths)
    available = tokens.size - 1
    if longest > available:
        raise PosbenchError(f"eval length {longest} is longer than the {available} {split} tokens available; "
                            f"valid: eval.lengths <= {available}")
    if longest > max_tokens:
        raise PosbenchError(f"eval.max_tokens={max_tokens} is smaller than the longest eval length {longest}; "
                            f"valid: eval.max_tokens >= {longest}")
    return min(max_tokens, available) // longest * longest


@torch.no_grad()
def perplexity_ladder(model: LanguageModel, tokens: np.ndarray, lengths: list[int], ecfg: EvalConfig,
                      device: torch.device, dtype) -> list[dict]:
    """-> one dict per length: eval_len, rope_scaling, rope_factor, nll, ppl, tokens, status.

    Under ``ecfg.rope_scaling`` each window of L tokens is rotated with factor
    ``ecfg.rope_factor``, or s = max(1, L / train_len) when that is null."""
    n = scored_tokens(tokens, lengths, ecfg.max_tokens, ecfg.split)
    ids = torch.from_numpy(tokens[: n + 1].astype(np.int64))
    kind, train_len = ecfg.rope_scaling, model.encoding.dims.train_len
    model.eval()
    rows = []
    with rope_scaling(model.encoding, kind, ecfg.rope_factor):
        for length in lengths:
            inputs, targets = ids[:-1].view(-1, length), ids[1:].view(-1, length)  # (n/L, L)
            per_batch = max(1, ecfg.batch_tokens // length)
            total, status = 0.0, "ok"
            bar = tqdm(range(0, inputs.shape[0], per_batch), desc=f"eval L={length}", leave=False,
                       disable=None, file=sys.stderr)
            try:
                for i in bar:
                    x, y = inputs[i:i + per_batch].to(device), targets[i:i + per_batch].to(device)
                    with autocast(device, dtype):
                        total += model.loss(x, y, reduction="sum").double().item()
            except PositionRangeError as e:
                total, status = math.nan, f"n/a: {e}"
            nll = total / n
            rows.append({"eval_len": length, "rope_scaling": kind,
                         "rope_factor": scaling_factor(kind, ecfg.rope_factor, length, train_len),
                         "nll": nll, "ppl": math.exp(nll) if status == "ok" else math.nan,
                         "tokens": n, "status": status})
    return rows


def result_rows(cfg: DictConfig, ladder: list[dict], steps: int) -> pd.DataFrame:
    meta = {"split": cfg.eval.split, "encoding": cfg.encoding.name, "model": cfg.model.name, "data": cfg.data.name,
            "train_len": int(cfg.train.train_len), "seed": int(cfg.seed), "steps": steps,
            "config_hash": config_hash(cfg), "code_version": code_version(),
            "rope_scaling": "none", "rope_factor": 1.0}  # a ladder row's own values win
    cols = KEY + ["rope_factor", "ppl", "nll", "tokens", "status", "model", "data", "steps",
                  "config_hash", "code_version"]
    return pd.DataFrame([{**meta, **row} for row in ladder])[cols]


@contextmanager
def _locked(directory: Path):
    """Exclusive flock on the run directory itself for a read-merge-write, so jobs writing one
    results.csv at the same time do not drop each other's rows (and leave no lock file)."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): jobs must not overlap
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def write_results(run: RunDir, new: pd.DataFrame) -> pd.DataFrame:
    """Merge rows into the run's results.csv (new rows replace old ones of the same key),
    redraw the plot; both files are replaced atomically, under a lock held across the merge."""
    from .report import plot_ppl_vs_length, read_results, sort_rows

    with _locked(run.path):
        if run.results.exists():
            old = read_results(run.results)
            old = old[~old.set_index(KEY).index.isin(new.set_index(KEY).index)]
            new = pd.concat([old, new], ignore_index=True)
        new = sort_rows(new, KEY)
        atomic_write_text(run.results, new.to_csv(index=False))
        plot_ppl_vs_length(new, run.plot)
    return new


def evaluate(cfg: DictConfig) -> pd.DataFrame:
    """`posbench eval checkpoint=<run dir>`: evaluate a trained run at ``cfg.eval`` lengths."""
    if not cfg.get("checkpoint"):
        raise PosbenchError("posbench eval needs checkpoint=<run dir> (a directory made by posbench train)")
    run = RunDir.existing(cfg.checkpoint)
    state = load_checkpoint(run.checkpoint)
    train_cfg = OmegaConf.load(run.config)
    if state.get("config_hash") != config_hash(train_cfg):
        raise PosbenchError(f"{str(run.config)!r} does not describe the model in {str(run.checkpoint)!r} "
                            f"(config hash {config_hash(train_cfg)} != {state.get('config_hash')}); "
                            "was config.yaml edited? restore it or retrain")
    train_cfg.eval = cfg.eval
    ecfg = typed(EvalConfig, train_cfg.eval, "eval")
    check_scalable(str(train_cfg.encoding.name), ecfg.rope_scaling)  # before loading anything
    device = resolve_device(cfg.get("device", "auto"))
    corpus = load_corpus(train_cfg.data)
    model = build_model(train_cfg, corpus.vocab_size)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        raise PosbenchError(f"checkpoint {str(run.checkpoint)!r} does not match the model in its config.yaml "
                            f"({str(e).splitlines()[0]})") from e
    model.to(device)
    dtype = autocast_dtype(device, str(train_cfg.train.precision))
    lengths = ecfg.resolve_lengths(int(train_cfg.train.train_len))
    ladder = perplexity_ladder(model, corpus.splits[ecfg.split], lengths, ecfg, device, dtype)
    rows = result_rows(train_cfg, ladder, int(state["step"]))
    write_results(run, rows)
    return rows
