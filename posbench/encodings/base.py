"""The position-encoding hook interface.

Every scheme in the length-extrapolation literature touches attention at one or
more of four places. An encoding is a ``nn.Module`` that overrides only the hooks
it needs; the attention kernel picks its path from which hooks are overridden
(:meth:`PositionEncoding.hooks`). Besides the hooks it reads exactly two class attributes,
both of which default to the slow path that is right for every encoding:
``layer_invariant_bias`` (False: the bias is rebuilt in every layer; True lets one bias built in
layer 0 serve every layer) and ``relative_bias`` (False: the bias is built per query chunk; True
lets one Toeplitz table serve every chunk at consecutive positions); and two methods,
:meth:`~PositionEncoding.pair_cost` and :meth:`~PositionEncoding.logit_scale`. An encoding sets
a flag to True only where its bias
has that property; ``tests/test_encodings.py`` checks every registered encoding against a
forward pass that shares nothing between layers. A third attribute, ``reads_positions``, is
read by no kernel: True unless the output ignores the position values (randomized positions
then change nothing); ``tests/test_random_positions.py`` checks it for every encoding.

=============  ==============================================  ===================
hook           what it changes                                 examples
=============  ==============================================  ===================
``embed``      the token embeddings before the first block     sinusoidal, learned,
                                                               complex, conv, rnn
``rotate``     q and k inside every attention layer            rope, xpos
``bias``       a static additive logit bias b(h, i, j)         alibi, t5, kerple,
               that depends on positions only                  sandwich, fire
``score``      content-dependent logit terms that need q and   shaw, xl, deberta,
               k themselves (and ``value`` for terms added     tener, cope
               to the attention output)
``decay``      a data-dependent decay: per-token log forget    fox, cable,
               gates log f_t (B, H, T) from the layer's input, path_fox
               the logit of (i, j) gaining sum_{j<t<=i} log f_t
``transition`` a data-dependent transform per token: unit    path,
               vectors w (B, H, T, hs) and beta (B, H, T) from path_fox
               the layer's input, the logit of (i, j) being
               q_i^T H_i .. H_{j+1} k_j, H_t = I - beta_t w_t w_t^T
``normalize``  attention weights from the logits in place of   stickbreaking
               softmax; weights may sum to less than 1, the
               rest going to the query's own value
``features``   position features e (B, H, T, F) carried from   tape
               layer to layer beside the residual stream: q
               and k transformed by the layer's e, e averaged
               with the weights of v, then updated from the
               block's MLP output
=============  ==============================================  ===================

``bias`` is written with broadcasting element-wise ops on position tensors, so
a kernel may call it on a query chunk (``q_pos`` of shape (Tq,)) against all
keys, and a score-modifier kernel may call it on index tensors. Positions are
strictly increasing integers, ``arange(T)`` unless the model was given others
(randomized positions, :mod:`posbench.encodings.randomized`), so hooks must use the position
values, not the length of the position tensors. Content hooks
are always called on query chunks, so their memory stays linear in length.

One encoding instance is shared by all layers; hooks receive ``layer`` so a
scheme can keep per-layer parameters (a ``ModuleList``) when its paper asks.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ..errors import PosbenchError

HOOKS = ("embed", "rotate", "bias", "score", "value", "decay", "transition", "normalize", "features")

REGISTRY: dict[str, type["PositionEncoding"]] = {}


class PositionRangeError(PosbenchError):
    """An encoding was asked for positions it cannot represent (e.g. past a learned table)."""


@dataclass(frozen=True)
class ModelDims:
    """Model shape an encoding needs to size its parameters."""

    d_model: int
    n_heads: int
    n_layers: int
    train_len: int
    vocab_size: int = 0  # for schemes with word-dependent parameters (complex embeddings)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class PositionEncoding(nn.Module):
    """Base class: no position information at all (every hook is the identity)."""

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    description: ClassVar[str] = ""
    # Whether runs of this encoding scaled token embeddings by sqrt(d_model) before the one model
    # setting existed (``model.embed_scale``); read only for a config.yaml without that key.
    scale_token_embedding: ClassVar[bool] = False
    # True only when ``bias`` is the same in every layer: the attention kernel then builds it once
    # per forward pass and reuses layer 0's bias in every layer. False (the safe default) rebuilds
    # it in every layer, which is right for any encoding, only slower.
    layer_invariant_bias: ClassVar[bool] = False
    # True when ``bias(i, j)`` depends on i - j only (a Toeplitz matrix): the attention kernel
    # then builds it once per forward pass and slices it for every query chunk.
    relative_bias: ClassVar[bool] = False
    # False when the output does not depend on the position values, only on the tokens' order
    # (NoPE, and schemes that count positions from the context or a causal layer): randomized
    # positions (``train.random_positions``, :mod:`posbench.encodings.randomized`) then change nothing.
    # ``tests/test_random_positions.py`` checks the flag of every registered encoding.
    reads_positions: ClassVar[bool] = True
    # Options whose default changed, with the value a config written before the option existed
    # meant (a saved run's config.yaml lacks the key): :func:`saved_options` fills them in.
    former_defaults: ClassVar[dict] = {}

    @property
    def reference_len(self) -> int:
        """The context a RoPE scaling's factor is relative to (:mod:`posbench.eval.ladder`): the trained
        length, unless the encoding sets another (rotary's ``original_len``)."""
        return self.__dict__.get("_reference_len") or self.dims.train_len

    @reference_len.setter
    def reference_len(self, value: int) -> None:
        self.__dict__["_reference_len"] = int(value)

    def __init__(self, dims: ModelDims):
        super().__init__()
        self.dims = dims

    # ---- hooks (override only what the scheme needs) -------------------------
    def embed(self, x: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """x: (B, T, D) token embeddings, positions: (T,), tokens: (B, T) ids -> (B, T, D)."""
        return x

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, layer: int):
        """q, k: (B, H, T, hs), positions: (T,) -> transformed (q, k)."""
        return q, k

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, layer: int) -> torch.Tensor:
        """q_pos: (Tq,), k_pos: (Tk,) -> additive logit bias (H, Tq, Tk)."""
        raise NotImplementedError

    def score(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor,
              k_pos: torch.Tensor, layer: int) -> torch.Tensor:
        """q: (B, H, Tq, hs), k: (B, H, Tk, hs) -> extra logits (B, H, Tq, Tk)."""
        raise NotImplementedError

    def value(self, probs: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
              layer: int) -> torch.Tensor:
        """probs: (B, H, Tq, Tk) attention weights -> extra output (B, H, Tq, hs)."""
        raise NotImplementedError

    def decay(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """x: (B, T, D), the attention layer's input (after its norm) -> log forget gates (B, H, T),
        each <= 0: the logit of query i and key j <= i gains sum_{t = j+1 .. i} log f_t (the
        attention kernel sums them, :func:`posbench.model.attention.causal_attention`'s ``decay``)."""
        raise NotImplementedError

    def transition(self, x: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, T, D), the attention layer's input (after its norm) -> (w, beta): unit vectors w
        (B, H, T, hs) and beta (B, H, T) in (0, 2), the transform H_t = I - beta_t w_t w_t^T of each
        token; the logit of query i and key j < i is q_i^T H_i ... H_{j+1} k_j (q_i^T k_i at j = i),
        computed by :func:`posbench.model.householder.householder_attention`."""
        raise NotImplementedError

    def normalize(self, logits: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, hidden: torch.Tensor,
                  layer: int) -> torch.Tensor:
        """logits: (B, H, Tq, Tk) scaled fp32 logits of a query chunk against its keys, ``hidden``:
        (Tq, Tk) True where the query may not see the key -> attention weights (B, H, Tq, Tk), 0
        where hidden. Replaces softmax; 1 minus a query's weights goes to its own value."""
        raise NotImplementedError

    # The ``features`` hook's e between the layers of one forward pass, set by the model
    # (:func:`posbench.model.transformer.carried_features`): made at layer 0, None after the last.
    carried = None

    def features(self, positions: torch.Tensor, batch: int) -> torch.Tensor:
        """positions: (T,) -> the position features e (B, H, T, F) of the first layer. An encoding
        that overrides it carries e through the model beside the residual stream
        (:mod:`posbench.model.transformer`): each layer transforms q and k by its e
        (:meth:`rotate_features`, after ``rotate``), attends e with the weights of v (e rides as F
        more value dims, so every kernel computes sum_j A_ij e_j with the values), and
        :meth:`update_features` makes the next layer's e (not called after the last layer).
        ``value`` cannot be combined with it."""
        raise NotImplementedError

    def rotate_features(self, q: torch.Tensor, k: torch.Tensor, e: torch.Tensor, layer: int):
        """q, k: (B, H, T, hs), e: (B, H, T, F) the layer's position features -> transformed (q, k)
        in q's dtype."""
        raise NotImplementedError

    def update_features(self, e: torch.Tensor, attended: torch.Tensor, h: torch.Tensor, layer: int) -> torch.Tensor:
        """e: (B, H, T, F) the layer's features; attended: (B, H, T, F) sum_j A_ij e_j under the layer's
        attention weights A; h: (B, T, D) the block's MLP output (before the residual) -> the next
        layer's features (B, H, T, F)."""
        raise NotImplementedError

    def attention_window(self, layer: int) -> int:
        """A sliding window this encoding puts on ``layer``'s attention (the query at i sees keys
        i - window < j <= i), 0 for none (the default): e.g. RoPE layers with a window and global
        NoPE layers (``rope_nope``'s ``window``). The model takes the narrower of this and
        ``model.window``."""
        return 0

    def pair_cost(self) -> int:
        """fp32 values per (query, key) pair (per batch row) that ``bias`` / ``score`` hold at
        once; the kernels size their query chunks by it to bound memory. Default: one per head."""
        return self.dims.n_heads

    def logit_scale(self) -> float:
        """Factor on q.k (and on the ``score`` terms' sum); 1/sqrt(head_dim) by default."""
        return self.dims.head_dim ** -0.5

    # ---- training-free extension at evaluation (``eval.extension``) ----------------
    # The :class:`posbench.encodings.extension.Extension` in effect inside :meth:`extended`; None outside it.
    # log-n scales every query (any encoding); Self-Extend and ReRoPE replace the rotation and the
    # attention of the encodings that give their frequencies (:meth:`extension_frequencies`).
    extension = None
    # True where the positions are a pure rotation by :meth:`extension_frequencies`, which
    # Self-Extend and ReRoPE can then regroup (rope and its partial and hybrid forms; not xPos,
    # whose q and k also decay).
    regroupable: ClassVar[bool] = False

    def extension_frequencies(self, layer: int, device=None) -> torch.Tensor:
        """(hs/2,) rotary frequencies of ``layer``, pair i being (x_i, x_{i+hs/2}), on which
        Self-Extend and ReRoPE set positions of their own (zeros: a layer without positions)."""
        raise NotImplementedError

    def check_extension(self, ext) -> None:
        """One line unless ``ext`` runs on this encoding: ``none`` and ``logn`` on any; the methods that
        set rotary positions themselves (``Extension.sets_positions``) on the ``regroupable`` ones."""
        if ext.sets_positions and not self.regroupable:
            fit = sorted(name for name, cls in REGISTRY.items() if cls.regroupable)
            raise PosbenchError(f"eval.extension={ext.method} regroups rotary positions: it runs on {', '.join(fit)}; "
                                f"this run uses {self.name!r}; valid here: eval.extension=none or logn")

    @contextmanager
    def extended(self, ext):
        """Evaluate under training-free extension ``ext`` within the block (``none``: as trained)."""
        self.check_extension(ext)
        old, self.extension = self.extension, (None if ext.method == "none" else ext)
        try:
            yield self
        finally:
            self.extension = old

    def extended_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                           layer: int) -> torch.Tensor:
        """Self-Extend or ReRoPE attention of ``q``, ``k`` as projected (not rotated), ``v`` (B, H,
        T, hs) at positions 0..T-1 -> (B, H, T, hs), by :func:`posbench.encodings.extension.extended_attention`
        on :meth:`extension_frequencies`."""
        from .extension import extended_attention

        T = q.shape[-2]
        if int(positions[0]) != 0 or int(positions[-1]) != T - 1:
            raise PosbenchError(f"eval.extension={self.extension.method} needs positions 0..{T - 1}; got "
                                f"{int(positions[0])}..{int(positions[-1])}")
        freq = self.extension_frequencies(layer, q.device)
        return extended_attention(q, k, v, freq, self.extension, self.logit_scale()).to(v.dtype)

    # ---- fine-tuning from a parent run (``train.init_from``) ------------------------
    def from_parent(self, name: str, value: torch.Tensor) -> torch.Tensor | None:
        """The parent's parameter ``name`` (relative to the encoding) made this encoding's where
        its shape differs: None (the default) where it cannot be, which the fine-tuning loader
        reports in one line. A learned table interpolates its positions
        (:meth:`posbench.encodings.absolute.Learned.from_parent`)."""
        return None

    # ---- introspection --------------------------------------------------------
    @classmethod
    def hooks(cls) -> tuple[str, ...]:
        """Names of the hooks this class overrides, e.g. ('bias',)."""
        return tuple(h for h in HOOKS if getattr(cls, h) is not getattr(PositionEncoding, h))

    @classmethod
    def hook_kind(cls) -> str:
        """One word for tables: embed, rotate, bias, score, decay, transition, normalize, features, or none."""
        hooks = cls.hooks()
        for kind in ("transition", "decay", "normalize", "features"):  # three pick the kernel, one the flow
            if kind in hooks:
                return kind
        if "score" in hooks or "value" in hooks:
            return "score"
        return hooks[0] if hooks else "none"

    @classmethod
    def params(cls) -> list[str]:
        """Constructor keyword arguments a YAML file may set."""
        return list(cls.defaults())

    @classmethod
    def defaults(cls) -> dict:
        """Constructor keyword arguments -> their defaults (``inspect.Parameter.empty`` where none)."""
        sig = inspect.signature(cls.__init__)
        return {name: p.default for name, p in sig.parameters.items() if name not in ("self", "dims")}

    @classmethod
    def build(cls, dims: ModelDims, options: dict, name: str | None = None) -> "PositionEncoding":
        """``cls(dims, **options)``, an option the constructor does not take being one PosbenchError."""
        unknown = sorted(set(options) - set(cls.params()))
        if unknown:
            raise PosbenchError(f"encoding {name or cls.name or cls.__name__!r} has no option {unknown[0]!r}; "
                                f"its options: {', '.join(cls.params()) or '(none)'}")
        return cls(dims, **options)

    def extra_repr(self) -> str:
        return f"name={self.name}, hooks={self.hooks()}"


def register(cls: type[PositionEncoding]) -> type[PositionEncoding]:
    """Class decorator: make an encoding available under ``cls.name``."""
    if not cls.name or cls.name in REGISTRY:
        raise ValueError(f"encoding name {cls.name!r} is empty or registered twice")
    REGISTRY[cls.name] = cls
    return cls
