"""What is evaluated, opened once: a trained run (``checkpoint=<run dir>``) or a pretrained model
(``pretrained=PATH``) becomes one :class:`~posbench.eval.probe.Subject`, and the ladder
(:func:`posbench.eval.ladder.evaluate_subject`) and the probes
(:func:`posbench.eval.probes.probe_subject`) run on it without asking which it is.

:func:`open_subject` checks what can be checked before anything heavy is loaded (the run dir and
its config hash, the RoPE scaling and the extension) and fills what both kinds share: the eval
config, the extension, the RoPE scaling of each length (:func:`~posbench.eval.probe.scaling_by_length`),
the config the rows carry and the folder they go to. What differs is in two small classes:

* :class:`TrainedRun`: its corpus is the run's own (its tokenizer tokenizes the probes' prompts);
  its weights load when a length needs them, so a ladder whose rows all exist loads nothing;
  lengths default to ``eval.multiples`` x train_len; the rows carry the run's config.yaml and go
  to its run dir.
* :class:`PretrainedModel`: loaded at once (its tokenizer tokenizes the corpus, cached under a
  key of that tokenizer); lengths default to :data:`posbench.eval.pretrained.MULTIPLES` x its
  context; the rows carry its measured config (:func:`~posbench.eval.pretrained.measured_config`)
  and go to ``out=``; a length that the scaling and extension leave as trained is the unscaled
  row, computed once (:attr:`~posbench.eval.probe.Subject.reuses_unscaled`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from ..config import EvalConfig, config_hash, typed
from ..data.corpus import load_corpus
from ..encodings.extension import Extension
from ..encodings.randomized import check_random_positions
from ..encodings.rotary import check_scalable
from ..errors import PosbenchError
from ..methods import Applied, method_class
from ..model.build import autocast_dtype, build_model, keep_freed_memory, resolve_device
from ..model.preflight import check_evaluation, check_pretrained
from ..runs.rundir import RunDir, atomic_write_text, load_checkpoint
from .pretrained import measured_config, output_dir, pretrained_lengths
from .probe import Subject, scaling_by_length


def apply_method(cfg: DictConfig) -> DictConfig:
    """``method=NAME method.OPTION=V ...`` (conf/method/NAME.yaml: the method's options by name,
    :meth:`~posbench.methods.Extension.option_fields`) written into the keys it stands for,
    ``eval.extension``, ``eval.extension_window`` and ``eval.extension_group`` (the older spelling,
    kept: eval.* is not hashed), so every later step reads one spelling. One line for an option
    the method lacks, a value that is not a positive integer, or a method or value the older keys
    name otherwise. -> ``cfg``, changed in place."""
    method = cfg.get("method")
    if method is None or str(method.get("name", "none")) == "none":
        return cfg
    name = str(method.name)
    fields = method_class(name).option_fields()
    unknown = [key for key in method if key not in ("name", *fields)]
    if unknown:
        valid = ", ".join(f"method.{option}" for option in fields) or "none (it has no options)"
        raise PosbenchError(f"method.{unknown[0]} is not an option of method={name}; valid: {valid}")
    with open_dict(cfg):
        named = str(cfg.eval.get("extension") or "none")
        if named not in ("none", name):
            raise PosbenchError(f"method={name} and eval.extension={named} name two methods; valid: one of them "
                                "(eval.extension=NAME is method=NAME's older spelling)")
        cfg.eval.extension = name
        for option, field in fields.items():
            value = method.get(option)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PosbenchError(f"method.{option}={value!r} is not valid; valid: a positive integer, or null "
                                    "(the method's default)")
            key, old = f"extension_{field}", cfg.eval.get(f"extension_{field}")
            if old is not None and old != value:
                raise PosbenchError(f"method.{option}={value} and eval.{key}={old} set one parameter twice; valid: "
                                    "one of them")
            cfg.eval[key] = value
    return cfg


def extension_of(ecfg: EvalConfig, train_len: int) -> Extension:
    """``eval.extension`` with its parameters, log-n relative to ``train_len``, the context the
    model trained on last; one line if it cannot run beside ``eval.rope_scaling``."""
    ext = Extension(ecfg.extension, ecfg.extension_window, ecfg.extension_group, int(train_len))
    ext.check_scaling(ecfg.rope_scaling)
    return ext


def scaling_label(kind: str, ext: Extension) -> str:
    """A row's ``rope_scaling``: the scaling, the extension (``self_extend(W=512,G=8)``), or both
    (``yarn+logn``), so no method's rows replace another's. A scaling named by its import path is
    named by its registered name."""
    return Applied.of(kind, ext).label


def open_run(cfg: DictConfig) -> tuple[RunDir, dict, DictConfig, EvalConfig]:
    """A trained run dir -> (run, checkpoint state, its config with ``cfg.eval``, eval config)."""
    keep_freed_memory()
    if not cfg.get("checkpoint"):
        raise PosbenchError("posbench eval needs checkpoint=<run dir> (a directory made by posbench train)")
    run = RunDir.existing(cfg.checkpoint)
    state = load_checkpoint(run.checkpoint)
    train_cfg = OmegaConf.load(run.config)
    if state.get("config_hash") != config_hash(train_cfg):
        raise PosbenchError(f"{str(run.config)!r} does not describe the model in {str(run.checkpoint)!r} "
                            f"(config hash {config_hash(train_cfg)} != {state.get('config_hash')}); "
                            "was config.yaml edited? restore it or retrain")
    own = train_cfg.get("eval", {}).get("max_tokens") or EvalConfig.max_tokens  # the run's own budget
    train_cfg.eval = cfg.eval
    if train_cfg.eval.get("max_tokens") is None:  # not given: the run's (posbench.eval.token_set)
        train_cfg.eval.max_tokens = own
    ecfg = typed(EvalConfig, train_cfg.eval, "eval")
    check_scalable(str(train_cfg.encoding.name), ecfg.rope_scaling)  # before loading anything
    return run, state, train_cfg, ecfg


def load_model(cfg: DictConfig, run: RunDir, state: dict, train_cfg: DictConfig, vocab_size: int):
    """-> (model with the checkpoint's weights on the device, device, autocast dtype)."""
    device = resolve_device(cfg.get("device", "auto"))
    model = build_model(train_cfg, vocab_size)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        raise PosbenchError(f"checkpoint {str(run.checkpoint)!r} does not match the model in its config.yaml "
                            f"({str(e).splitlines()[0]})") from e
    return model.to(device), device, autocast_dtype(device, str(train_cfg.train.precision))


@dataclass
class TrainedRun(Subject):
    """A posbench run dir (module docstring)."""

    run: RunDir | None = None
    state: dict | None = None
    command: DictConfig | None = None  # the eval command's config (``device``)
    source: Any = None  # the run's corpus

    def corpus(self):
        return self.source

    def load(self) -> None:
        if self.model is not None:
            return
        model, self.device, self.dtype = load_model(self.command, self.run, self.state, self.rows_config,
                                                    self.source.vocab_size)
        model.check_method(self.ext, self.ecfg.rope_scaling)
        self.model = model
        self.scaling = scaling_by_length(model.encoding, self.ecfg.rope_scaling, self.ecfg.rope_factor, self.train_len)

    def check_probe(self, probe) -> None:
        if self.random_positions is not None:
            raise PosbenchError(f"probe={probe.name} runs positions 0..T-1, but {self.run.path} was trained with "
                                f"train.random_positions={self.random_positions}; valid: runs trained "
                                "without train.random_positions (the perplexity ladder evaluates this run)")

    def preflight(self, ecfg, lengths: list[int]) -> None:
        check_random_positions(str(self.rows_config.encoding.name), self.random_positions, max(lengths),
                               ecfg.rope_scaling)
        self.load()
        check_evaluation(self.model, ecfg, lengths, self.device, self.dtype)


@dataclass
class PretrainedModel(Subject):
    """A Hugging Face model or a .gguf file (module docstring)."""

    command: DictConfig | None = None  # the eval command's config (``data``)
    fast_tokenizer: Any = None  # the tokenizer itself (``tokenizer`` leaves out the special tokens it adds)
    eos: str | None = None
    source: Any = None  # the corpus, once tokenized

    def corpus(self):
        if self.source is None:
            self.source = load_corpus(self.command.data, tokenizer=self.fast_tokenizer, eos_token=self.eos)
        return self.source

    def ladder_lengths(self) -> list[int]:
        return pretrained_lengths(self.ecfg, self.train_len)

    def preflight(self, ecfg, lengths: list[int]) -> None:
        check_pretrained(self.model, ecfg, lengths, self.device)

    def probe_preflight(self, lengths: list[int]) -> None:
        check_pretrained(self.model, self.ecfg, lengths, self.device)

    def prepare_out(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.out / "config.yaml", OmegaConf.to_yaml(self.rows_config))


def open_subject(cfg: DictConfig) -> Subject:
    """``checkpoint=<run dir>`` or ``pretrained=PATH`` -> its :class:`Subject` (module docstring)."""
    return open_pretrained(cfg) if cfg.get("pretrained") else open_trained(cfg)


def open_trained(cfg: DictConfig) -> TrainedRun:
    """A trained run with its corpus; its weights load when a length needs them."""
    for key, unset in PRETRAINED_ONLY.items():  # a trained run's windows have no BOS policy, its precision is its own
        if cfg.get(key) not in unset:
            raise PosbenchError(f"{key}={cfg.get(key)} applies to pretrained= models only; posbench eval "
                                f"checkpoint={cfg.checkpoint} evaluates a trained run as it trained; valid: leave "
                                f"{key} out")
    given = given_budget(cfg)  # before open_run fills the run's own
    run, state, train_cfg, ecfg = open_run(cfg)
    train_len = int(train_cfg.train.train_len)
    ext = extension_of(ecfg, train_len)  # one line if it cannot run, before loading anything
    corpus = load_corpus(train_cfg.data)
    return TrainedRun(None, corpus.tokenizer, None, None, train_len, ecfg.batch_tokens, ecfg=ecfg, ext=ext,
                      rows_config=train_cfg, out=run.path, step=int(state["step"]), budget_given=given,
                      random_positions=train_cfg.train.get("random_positions"), run=run, state=state, command=cfg,
                      source=corpus)


def open_pretrained(cfg: DictConfig, weights: bool = True) -> PretrainedModel:
    """``cfg.pretrained`` loaded on ``cfg.device`` (precision ``cfg.precision``, default auto; BOS
    policy ``cfg.bos``, default first: :func:`posbench.model.pretrained.load_pretrained`). Without
    ``weights``, its config and tokenizer alone (``model`` is None): enough for :func:`ladder_plan`
    and the probes' rows to say what is left to compute (``posbench study`` plans with it)."""
    from ..model.pretrained import PieceTokenizer, describe_pretrained, load_pretrained

    given = given_budget(cfg)
    if not given:
        cfg.eval.max_tokens = EvalConfig.max_tokens
    ecfg = typed(EvalConfig, cfg.eval, "eval")
    # The system allocator, not keep_freed_memory: a Hugging Face forward's blocks of many sizes
    # fragment a heap that never unmaps. Gemma 3 270M at 2 x 2,048 tokens peaked at 7.7 GB resident
    # with it and 4.1 GB without, in the same time (1:47 and 1:50 min); at 4,096 it was killed at
    # 23 GB, and takes 4.1 GB without.
    device = resolve_device(str(cfg.device))
    precision = str(cfg.get("precision") or "auto")
    bos = pretrained_bos(cfg)
    if weights:
        model, tokenizer, eos = load_pretrained(str(cfg.pretrained), device, precision, bos)
        dtype = next(model.parameters()).dtype
        described = model
    else:
        described, tokenizer, eos = describe_pretrained(str(cfg.pretrained), bos)
        model, dtype = None, torch.float32
    train_len = described.encoding.train_len
    ext = extension_of(ecfg, train_len)
    check_scalable(described.encoding.name, ecfg.rope_scaling)
    if model is not None:  # which extensions run reads the rotary module (a description has none)
        model.encoding.check_extension(ext)
    scaling = scaling_by_length(described.encoding, ecfg.rope_scaling, ecfg.rope_factor, train_len)
    return PretrainedModel(model, PieceTokenizer(tokenizer), device, None if dtype == torch.float32 else dtype,
                           train_len, ecfg.batch_tokens, scaling, ecfg=ecfg, ext=ext,
                           rows_config=measured_config(cfg, described, precision),
                           out=output_dir(cfg, described, make=False), reuses_unscaled=True, command=cfg,
                           fast_tokenizer=tokenizer, eos=eos, budget_given=given)


def pretrained_bos(cfg: DictConfig) -> str:
    """``cfg.bos`` checked, ``auto`` (the default) resolved to the policy the model trained with
    (:func:`posbench.model.pretrained.trained_bos`) and written back, so the rows' config and the
    model's name (``+bos`` under every) say the policy that was used."""
    from ..model.pretrained import BOS_CHOICES, trained_bos

    bos = str(cfg.get("bos") or "auto")
    if bos not in BOS_CHOICES:
        raise PosbenchError(f"bos={bos!r} is not valid; valid choices: {', '.join(BOS_CHOICES)} (auto: as the model "
                            "was trained, from its tokenizer's add_bos_token)")
    if bos == "auto":
        bos = trained_bos(str(cfg.pretrained))
        with open_dict(cfg):
            cfg.bos = bos
    return bos


#: posbench eval's options for a pretrained model alone, each with the value that means "not given"
PRETRAINED_ONLY = {"bos": ("auto", None), "precision": ("auto", None), "out": (None,)}


def given_budget(cfg: DictConfig) -> bool:
    """Whether the command gave ``eval.max_tokens`` (posbench eval's default is null: the subject's
    own, the token set its rows score or, without rows, a run's eval.max_tokens, 131,072 for a
    pretrained model; :mod:`posbench.eval.token_set`)."""
    return cfg.get("eval", {}).get("max_tokens") is not None
