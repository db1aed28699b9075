"""Fine-tune a finished run: start from its weights under another encoding, length or schedule.

``train.init_from=<run dir>`` starts this run from the parent's final weights
(``checkpoints/last.pt``) with a fresh optimizer, step 0 and this run's own schedule, and then
trains, checkpoints, resumes and evaluates as any run (once the run has its own last.pt it
resumes from that, never from the parent again). The protocols it serves:

* **DroPE** (Gelberg, Eguchi, Akiba & Cetin 2025, "Extending the Context of Pretrained LLMs by
  Dropping Their Positional Embeddings", arXiv 2512.12167; SakanaAI/DroPE): train with RoPE,
  drop it, recalibrate briefly at the same length. Here: ``encoding=nope
  train.init_from=<rope run> train.schedule=constant``, with ``model.qk_norm=true`` for the
  reference's ``qk_norm_nope`` variant (new RMSNorm gains, initialised to 1). The reference
  recalibrates at a constant learning rate (its SmolLM runs: 3e-4, no decay).
* **Extension by fine-tuning** (Chen et al. 2023, PI; Peng et al. 2023, YaRN): rope at a longer
  ``train.train_len`` with a scaling active in training, ``encoding.trained_scaling=pi|ntk|yarn|dynamic_ntk``
  relative to ``encoding.original_len`` (the parent's train_len;
  :class:`posbench.encodings.rotary.Rotary`). PI fine-tunes with a short warmup, then a small
  constant learning rate (``train.schedule=constant``). A learned table grows to the longer
  length by interpolating its positions (the encoding's ``from_parent``:
  :meth:`posbench.encodings.absolute.Learned.from_parent`); bias encodings simply continue.

What may differ from the parent: the encoding (the parent's own ``encoding.*`` parameters are
dropped, the new encoding's start as it initialises them), ``train.*`` (length, steps, learning
rate, schedule), ``eval.*``, and the model options that add parameters of their own or none
(``model.qk_norm``, ``model.length_scaling``, ``model.window``). What must match, checked
before anything is loaded: every other hashed ``model.*`` key (the network's shape) and the
corpus (``data.*``, the same tokenizer and token ids). The config hash covers the parent's config
hash (``train.init_hash``, filled in from the path), not the path: children of one config's
seeds share a hash and pool in a report as seeds do.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from ..config import RunConfig, config_hash, flat_items, hashed_part
from ..errors import PosbenchError
from ..runs.rundir import RunDir, load_checkpoint

FREE_MODEL_KEYS = ("qk_norm", "length_scaling", "ssmax_init", "window")  # may differ from the parent
ADDED = ("encoding.", "length_scaling.")  # parameter prefixes a child may have and its parent lack
ADDED_INSIDE = (".attn.q_norm.", ".attn.k_norm.")  # ... and infixes (QK-norm's gains)


def _shape_keys(config: dict) -> dict:
    """The hashed model.* and data.* keys, flattened, without :data:`FREE_MODEL_KEYS`."""
    kept = hashed_part({k: config.get(k) for k in ("model", "data") if k in config})
    return {k: v for k, v in flat_items(kept) if not any(k == f"model.{free}" for free in FREE_MODEL_KEYS)}


def _parent_dir(init_from: str) -> tuple[Path, str]:
    where = f"train.init_from={init_from!r}"
    source = Path(str(init_from)).expanduser()
    if not (source / "config.yaml").is_file() or not RunDir(source).checkpoint.is_file():
        raise PosbenchError(f"{where} is not a trained posbench run dir (it needs config.yaml and "
                            "checkpoints/last.pt); valid: the run dir of a finished posbench train")
    return source, where


def set_parent_hash(cfg: DictConfig) -> None:
    """Fill in ``train.init_hash``, the parent's config hash, which this run's hash covers in
    place of the path (a hash ignores the seed, so the children of one config's seeds pool in a
    report as its seeds do), and ``train.init_len``, the parent's train_len, which results rows
    carry beside the run's own (not hashed: the parent's hash covers it). Written into ``cfg``:
    the copy :func:`posbench.train.configure.train_config` makes."""
    if cfg.train.get("init_from") is None:
        for key in ("init_hash", "init_len"):
            if cfg.train.get(key) is not None:
                raise PosbenchError(f"train.{key}={cfg.train[key]!r} is filled in from train.init_from; "
                                    "valid: train.init_from=<run dir>")
        return
    source, _ = _parent_dir(cfg.train.init_from)
    parent = OmegaConf.load(source / "config.yaml")
    with open_dict(cfg):
        cfg.train.init_hash = config_hash(parent)
        cfg.train.init_len = int(parent.train.train_len)


def read_parent(rc: RunConfig, model: torch.nn.Module, corpus_key: str) -> dict:
    """Load ``train.init_from``'s final weights into ``model`` -> what the run prints and records
    (parent dir, step, config hash, dropped and added parameter names). One PosbenchError, and
    nothing loaded, where the parent is no finished run of the same network and corpus."""
    source, where = _parent_dir(rc.train.init_from)
    run = RunDir(source)
    theirs = OmegaConf.to_container(OmegaConf.load(source / "config.yaml"), resolve=True)
    ours = OmegaConf.to_container(rc.tree, resolve=True)
    a, b = _shape_keys(theirs), _shape_keys(ours)
    differ = [f"{k} ({a.get(k)} there, {b.get(k)} here)" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    if differ:
        raise PosbenchError(f"{where} trained another network or corpus: {', '.join(differ[:3])}; valid: a run "
                            "that differs only in the encoding, train.*, eval.* and "
                            f"model.{', model.'.join(FREE_MODEL_KEYS)}")
    state = load_checkpoint(run.checkpoint)
    if state["config_hash"] != rc.train.init_hash:
        raise PosbenchError(f"{where}: its checkpoint is of config hash {state['config_hash']}, its config.yaml of "
                            f"{rc.train.init_hash}; valid: a run dir whose config.yaml was not edited")
    steps = int(theirs["train"]["steps"])
    if int(state["step"]) < steps:
        raise PosbenchError(f"{where} stopped at step {state['step']} of {steps}; valid: a finished run (re-run its "
                            "command to finish it)")
    if state.get("corpus_key") not in (None, corpus_key):
        raise PosbenchError(f"{where} was trained on another tokenization of the corpus ({state.get('corpus_key')} "
                            f"there, {corpus_key} here); valid: a run of the same data config")
    weights, own = state["model"], model.state_dict()
    dropped = sorted(k for k in set(weights) - set(own))
    added = sorted(k for k in set(own) - set(weights))
    bad = [k for k in dropped if not k.startswith("encoding.")] + \
          [k for k in added if not (k.startswith(ADDED) or any(s in k for s in ADDED_INSIDE))]
    if bad:
        raise PosbenchError(f"{where}: parameter {bad[0]!r} is in only one of the two models; valid: a parent whose "
                            "network differs in the encoding and the model options QK-norm and SSMax only")
    adapted = []  # the encoding's parameters of another shape, made this run's by the encoding (a learned table)
    for key in sorted(set(weights) & set(own)):
        if key.startswith("encoding.") and weights[key].shape != own[key].shape:
            value = model.encoding.from_parent(key.removeprefix("encoding."), weights[key])
            if value is not None:
                adapted.append(f"{key} {tuple(weights[key].shape)} -> {tuple(value.shape)}")
                weights = {**weights, key: value}
    try:
        model.load_state_dict({k: v for k, v in weights.items() if k in own}, strict=False)
    except RuntimeError as e:  # a parameter of another shape (a learned table of another length)
        raise PosbenchError(f"{where}: {str(e).strip().splitlines()[-1].strip()}; valid: a parent whose "
                            "parameters have this run's shapes") from e
    return {"dir": str(source), "step": int(state["step"]), "config_hash": state["config_hash"],
            "dropped": dropped, "added": added, "adapted": adapted}
