"""The public base of a probe and what it measures (the registry and the runner:
:mod:`posbench.eval.probes`, which documents the contract)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import torch

from ..config import ladder_lengths
from ..encodings.rotary import rope_scaling
from ..methods import scaling_factor
from ..model.build import autocast

RUN_KEY = ["encoding", "rope_scaling", "train_len", "seed"]  # a probe row's run, before the probe's own key
TRAILER = ["config_hash", "code_version", "status"]


@dataclass
class Subject:
    """What is evaluated, a trained run or a pretrained model, in the one interface the ladder and
    the probes run on (:mod:`posbench.eval.subject` opens either). A probe reads the first fields:
    a causal LM (``model(ids (B, T)) -> logits (B, T, V)``) with its tokenizer
    (``tokenizer.encode(text).ids``), where and how to run it, its trained context and the RoPE
    scaling of each length (a context manager, as in the ladder). The others are what the ladder
    and the rows need: the eval config and extension, the config the rows carry (its identity and
    config hash), the folder they go to and the training steps of the weights; the methods say
    what differs between a trained run and a pretrained model."""

    model: torch.nn.Module | None
    tokenizer: Any
    device: torch.device | None
    dtype: torch.dtype | None
    train_len: int
    batch_tokens: int = 16384
    scaling: Callable[[int], AbstractContextManager] = lambda length: nullcontext()
    ecfg: Any = None  # the EvalConfig it is evaluated under
    ext: Any = None  # eval.extension (posbench.encodings.extension.Extension)
    rows_config: Any = None  # the config its rows carry: a run's config.yaml, a pretrained model's measured one
    out: Path | None = None  # the folder its rows go to (a run dir's layout)
    step: int = 0  # training steps of the weights
    random_positions: int | None = None  # the run's train.random_positions
    reuses_unscaled: bool = False  # a length the scaling leaves as trained is the unscaled row, stored twice
    budget_given: bool = True  # eval.max_tokens came from the command, not the subject's own default

    def autocast(self) -> AbstractContextManager:
        """The precision the model runs in (bf16 autocast where the run's device has it)."""
        return autocast(self.device, self.dtype)

    def load(self) -> None:
        """Bring the weights onto the device where they are not yet (a trained run loads them once a
        length needs them)."""

    def corpus(self):
        """The corpus the ladder scores, tokenized by this subject's tokenizer."""
        raise NotImplementedError

    def ladder_lengths(self) -> list[int]:
        """The ladder's lengths under :attr:`ecfg`."""
        return self.ecfg.resolve_lengths(self.train_len)

    def check_probe(self, probe) -> None:
        """One line where ``probe`` cannot measure this subject."""

    def preflight(self, ecfg, lengths: list[int]) -> None:
        """Load the weights and refuse an evaluation at ``lengths`` that cannot fit (unless
        eval.preflight=false)."""
        self.load()

    def probe_preflight(self, lengths: list[int]) -> None:
        """Load the weights and refuse a probe at ``lengths`` that cannot fit, where the subject
        has such a check (a pretrained model's)."""
        self.load()

    def prepare_out(self) -> None:
        """Make :attr:`out` ready for rows, once every check has passed."""


def scaling_by_length(encoding, kind: str, factor: float | None,
                      train_len: int) -> Callable[[int], AbstractContextManager]:
    """A subject's ``scaling``: RoPE scaling ``kind`` (``eval.rope_scaling``) of ``encoding`` at each
    length, with s = ``factor`` (``eval.rope_factor``), or max(1, length / ``train_len``) where null,
    as the ladder scales each window."""

    def scaling(length: int) -> AbstractContextManager:
        return rope_scaling(encoding, kind, scaling_factor(kind, factor, length, train_len))

    return scaling


def encode_piece(tokenizer, text: str) -> list[int]:
    """The token ids of one piece of a prompt (a filler sentence, a needle, the question, the
    answer): ``text`` with a leading space, so that each piece tokenizes the same alone and joined
    into the prompt by spaces, and a prompt is cut to an exact token count. Every prompt probe
    (passkey, the needles, variable tracking) encodes its pieces with it."""
    return tokenizer.encode(" " + text).ids


class Probe:
    """The public base of every probe; see the module docstring for the contract."""

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    description: ClassVar[str] = ""
    key: ClassVar[tuple[str, ...]] = ("length",)
    metric: ClassVar[str] = "accuracy"
    grid: ClassVar[str | None] = None
    dtypes: ClassVar[dict[str, str]] = {}  # column -> pandas dtype of the written rows

    @dataclass
    class Options:
        lengths: list[int] | None = None  # prompt lengths in tokens; None: multiples x train_len
        multiples: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 4, 8, 16])

    def __init__(self, options):
        self.options = options

    def lengths(self, train_len: int) -> list[int]:
        """The lengths to probe: ``options.lengths``, else ``options.multiples`` x train_len."""
        return ladder_lengths(getattr(self.options, "lengths", None), getattr(self.options, "multiples", [1]),
                              train_len)

    def run(self, subject: Subject, lengths: list[int]) -> list[dict]:
        raise NotImplementedError

    def markdown(self, rows: pd.DataFrame) -> str:
        """The rows as a Markdown table: :attr:`metric` by length (and by :attr:`grid`, columns)."""
        grids = sorted(rows[self.grid].unique()) if self.grid else [None]
        head = [f"{self.grid} {g:g}" for g in grids] if self.grid else [self.metric]
        lines = ["| encoding | length | " + " | ".join(head) + " |", "|" + "---|" * (2 + len(head))]
        for (enc, length), g in rows.groupby(["encoding", "length"], sort=False):
            values = g.groupby(self.grid)[self.metric].mean() if self.grid else pd.Series({None: g[self.metric].mean()})
            cells = ["n/a" if pd.isna(values.get(x)) else f"{values.get(x):.2f}" for x in grids]
            lines.append(f"| {enc} | {length} | " + " | ".join(cells) + " |")
        return "\n".join(lines)
