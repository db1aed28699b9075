"""The base of every inference-time method: its parameters, its parts, and the registry by name.

A method (:mod:`posbench.methods`) is one class, registered under its ``eval.extension`` name by
``class SelfExtend(Extension, name="self_extend")``; ``Extension(name, window, group, train_len,
factor)`` builds the registered class of that name, so a config's string becomes the method's
object in one place. The base class is the method that changes nothing (every query sees its keys
at their trained positions, on the trained frequencies, at scale 1); each method overrides what
it changes. How the attention is then computed from a method's hooks
(:meth:`Extension.parts`, :meth:`Extension.visible`, :meth:`Extension.frequencies`, ...) is
:mod:`posbench.encodings.extension`'s, the same for every method.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar

import torch

from ..errors import PosbenchError

REGISTRY: dict[str, type[Extension]] = {}  # eval.extension name -> its class, in registration order


def logn_factor(n: torch.Tensor, train_len: int) -> torch.Tensor:
    """max(1, log n / log ``train_len``) for key counts ``n`` (any shape, float): the ``logn``
    method's factor on the query, and the one :mod:`posbench.model.length_scaling` trains with."""
    if train_len < 2:
        raise PosbenchError(f"log-n scaling needs a training length >= 2 (log base), got {train_len}")
    return torch.clamp(torch.log(n.float()) / math.log(train_len), min=1.0)


def method_text(method: str, params, values) -> str:
    """``self_extend(W=512,G=8)``: a method's name with each parameter ``params`` names (None: one
    it lacks) and its value, or the name alone where it names none."""
    named = [(name, value) for name, value in zip(params, values) if name]
    return f"{method}({','.join(f'{name}={value}' for name, value in named)})" if named else method


@dataclass(frozen=True)
class Part:
    """Some of the (query, key) pairs of a method and their rotary positions: the query at
    ``q_pos[i]``, the key at ``k_pos[j]`` (both (T,)), for the pairs where ``holds(i, j)`` ((Tq, 1)
    and (1, Tk) -> bool); ``keys(s, e)``: a key range [lo, hi) holding every pair of queries
    [s, e), so a query chunk scores no more keys than it needs."""

    q_pos: torch.Tensor
    k_pos: torch.Tensor
    holds: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    keys: Callable[[int, int], tuple[int, int]]


def near_part(pos: torch.Tensor, W: int) -> Part:
    """The pairs at distance < W with their trained positions."""
    return Part(pos, pos, lambda i, j: i - j < W, lambda s, e: (max(0, s - W + 1), e))


@dataclass(frozen=True)
class Extension:
    """A method and its parameters (``eval.extension``, ``eval.extension_window``,
    ``eval.extension_group``; what each means for each method: its class, and :attr:`params`);
    ``train_len``: the model's trained context; ``factor``: llama3's s (None: max(1, T /
    train_len) per window). A parameter left None takes its reference's default. This class is
    ``none``: the model as trained."""

    method: str = "none"
    window: int | None = None
    group: int | None = None
    train_len: int = 0
    factor: float | None = None

    name: ClassVar[str] = "none"
    paper: ClassVar[str] = ""  # its paper and reference code, for listings
    params: ClassVar[tuple[str | None, ...]] = ()  # what window and group are called in labels and errors
    # what window and group are called as options (``method=NAME method.OPTION=V``, conf/method/NAME.yaml),
    # for the parameters the method has (params)
    options: ClassVar[tuple[str, str]] = ("window", "group")
    # how posbench.encodings.extension computes it: "one" fused causal attention (no position moves),
    # "regroup" (near keys as trained, far keys at the method's positions), or from its "parts"
    kernel: ClassVar[str] = "one"
    sets_positions: ClassVar[bool] = True  # it sets rotary positions or frequencies itself (module docstring)
    moves: ClassVar[str] = "positions"  # what of the rotation it sets, for errors

    def __init_subclass__(cls, name: str | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if name is not None:
            cls.name = name
            REGISTRY[name] = cls

    def __new__(cls, method: str = "none", *args, **kwargs):
        if cls is Extension:  # the registered class of that name (or import path)
            from . import method_class  # the registry, which imports the built-ins

            cls = method_class(method)
        return super().__new__(cls)

    def __post_init__(self):
        if self.method != self.name:  # built by its class directly: the class names it
            object.__setattr__(self, "method", self.name)
        if self.factor is not None and not self.factor >= 1:
            raise PosbenchError(f"llama3's factor must be >= 1 (1 = no scaling) or None (T / train_len), "
                                f"got {self.factor}")
        self.validate()

    @classmethod
    def option_fields(cls) -> dict[str, str]:
        """``method.OPTION`` -> the parameter it sets (window, group): one for each the method has."""
        return {option: field for option, field, named in zip(cls.options, ("window", "group"), cls.params) if named}

    def validate(self) -> None:
        """One line unless the parameters suit the method (a method with defaults fills them here)."""

    @property
    def label(self) -> str:
        """How results rows name it: the name, with its parameters where it has some
        (``self_extend(W=512,G=8)``, ``rerope(W=512)``, ``string(S=21,W=5)``)."""
        return method_text(self.method, self.params, (self.window, self.group))

    def identity_at(self, length: int) -> bool:
        """Whether the method leaves the model as trained on windows of ``length`` tokens."""
        return True

    def check_scaling(self, kind: str) -> None:
        """One line unless the method runs beside RoPE scaling ``kind``: a method that sets the
        positions or frequencies of the rotation itself does so on the trained frequencies, so it
        takes none (log-n scales the queries and takes any: ``yarn+logn``)."""
        if self.sets_positions and kind != "none":
            raise PosbenchError(f"eval.extension={self.method} sets the rotary {self.moves} itself, on the trained "
                                f"frequencies, so it takes no eval.rope_scaling (got {kind}); valid with it: "
                                "eval.rope_scaling=none (eval.extension=logn takes any scaling)")

    def query_scale(self, i: torch.Tensor) -> torch.Tensor:
        """The factor on each query at positions ``i`` (log-n's; ones here)."""
        return torch.ones_like(i, dtype=torch.float32)

    def attention_factor(self, T: int) -> float:
        """The factor on q and on k (so the logits scale by its square) at a window of T."""
        return 1.0

    def frequencies(self, inv_freq: torch.Tensor, T: int) -> torch.Tensor:
        """The rotary frequencies the method rotates with at a window of T (the trained ones here)."""
        return inv_freq

    def visible(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """The mask hook: which keys ``j`` (1, Tk) each query ``i`` (Tq, 1) sees -> (Tq, Tk) bool (j <= i here)."""
        return j <= i

    def positions(self, i: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(query position, key position) of a ``regroup`` method's far pairs (d >= W) for queries ``i``
        (Tq, 1) and keys ``j`` (1, Tk)."""
        raise PosbenchError(f"eval.extension={self.method} has no far pairs")

    def parts(self, T: int, device=None) -> list[Part]:
        """The method's pairs in disjoint parts, each with its rotary positions (:class:`Part`);
        the union of the parts' pairs within :meth:`visible` is every visible pair."""
        pos = torch.arange(T, device=device)
        return [Part(pos, pos, lambda i, j: j <= i, lambda s, e: (0, e))]


class NoExtension(Extension, name="none"):
    """The model as trained."""

    sets_positions = False
