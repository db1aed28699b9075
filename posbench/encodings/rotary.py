"""Rotary position embeddings (``rotate`` hook): RoPE, xPos, and RoPE scaling at inference.

A rotary model trained on windows of ``train_len`` tokens can be stretched to longer
windows without retraining (:meth:`Rotary.scaled`): PI, NTK, dynamic NTK, YaRN and Llama 3's
scaling, each a class of :mod:`posbench.methods.rope` (``eval.rope_scaling``), which sets the
frequencies, positions and scale the rotation here uses (:meth:`Rotary.angle_table`). s = 1 is
plain RoPE for every scaling. Scaling is a setting of the module, not a parameter: checkpoints
are unchanged and the evaluator switches it per run.

Which dimensions form a rotated pair (``pairing``) differs between codebases:

===============  ==================================================  ============================
pairing          pair i                                              used by
===============  ==================================================  ============================
``half``         (x_i, x_{i + hs/2}), "rotate half" (the default)    GPT-NeoX, Hugging Face LLaMA
``interleaved``  (x_{2i}, x_{2i+1}), adjacent dims as one complex    RoFormer (Su et al. eq. 34),
                 number                                              Meta's LLaMA code, GPT-J,
                                                                     torchscale's xPos
===============  ==================================================  ============================

Both rotate pair i by p * theta_i, so they are the same function up to a fixed permutation
of each head's q and k dimensions: a model of one pairing becomes the other by permuting
the rows of its q and k projections (:mod:`posbench.convert`; Hugging Face's LLaMA weight
conversion script does the same with its ``permute``).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch

from ..config import PAIRINGS
from ..errors import PosbenchError
from ..methods import Rotation, rope_inv_freq, scaling, scaling_factor
from .base import REGISTRY, ModelDims, PositionEncoding, register
from .rotation import apply_rotary
from .span import span


def rope_angles(positions: torch.Tensor, head_dim: int, base: float) -> torch.Tensor:
    """theta_{p,i} = p * base^(-2i/hs). positions: (T,) -> (T, hs/2)."""
    return positions.float()[:, None] * rope_inv_freq(head_dim, base, positions.device)[None, :]


def check_pairing(pairing: str) -> str:
    if pairing not in PAIRINGS:
        raise PosbenchError(f"rope pairing {pairing!r} is not valid; valid choices: {', '.join(PAIRINGS)}")
    return pairing


# ---- RoPE scaling at inference (the scalings: posbench.methods.rope) -----------------------

def scaled_cos_sin(method, s: float, pos: torch.Tensor, inv_freq: torch.Tensor, angle=None):
    """cos, sin (T, n) of positions ``pos`` (T,) rotated by ``inv_freq`` (n,) under scaling
    ``method`` at s: the positions over its divisor, cos and sin times its attention factor.
    ``angle(pos, inv_freq)``: the angles of an encoding that computes them otherwise (default the
    product)."""
    divisor, factor = method.position_divisor(s), method.attention_factor(s)
    if divisor != 1.0:
        pos = pos / divisor
    angles = angle(pos, inv_freq) if angle else pos[:, None] * inv_freq[None, :]
    if factor != 1.0:
        return angles.cos() * factor, angles.sin() * factor
    return angles.cos(), angles.sin()


def rotary_encodings() -> list[str]:
    """Names of the registered encodings that accept a RoPE scaling."""
    return sorted(name for name, cls in REGISTRY.items() if issubclass(cls, Rotary))


def check_scalable(encoding_name: str, kind: str) -> None:
    """A PosbenchError unless ``kind`` is a scaling (:func:`posbench.methods.scaling`) and
    ``none`` or the encoding is rotary."""
    scaling(kind)
    cls = REGISTRY.get(encoding_name)
    if kind != "none" and not (cls is not None and issubclass(cls, Rotary)):
        raise PosbenchError(f"eval.rope_scaling={kind} needs a model trained with a rotary encoding "
                            f"({', '.join(rotary_encodings())}); this run uses {encoding_name!r}; "
                            "valid here: eval.rope_scaling=none")


def rope_scaling(encoding: PositionEncoding, kind: str, factor: float | None = None):
    """Context manager: ``encoding.scaled(kind, factor)``; nothing for ``none``; a PosbenchError
    for a scaling asked of a non-rotary encoding."""
    check_scalable(encoding.name, kind)
    return nullcontext(encoding) if kind == "none" else encoding.scaled(kind, factor)


# ---- encodings -----------------------------------------------------------------------------

@register
class Rotary(PositionEncoding):
    name = "rope"
    paper = "Su et al. 2021, RoFormer"
    description = "rotates q and k by position-dependent angles; q.k depends on i - j only"

    def __init__(self, dims: ModelDims, base: float = 10000.0, pairing: str = "half", trained_scaling: str = "none",
                 trained_factor: float | None = None, original_len: int | None = None):
        """``trained_scaling``, ``trained_factor``, ``original_len``: a RoPE scaling in effect from
        the start, in training and evaluation alike: the extension of a run trained on
        ``original_len`` positions by fine-tuning at a longer ``train.train_len``
        (``train.init_from``; Chen et al. 2023's PI, Peng et al. 2023's YaRN). s is
        ``trained_factor``, or max(1, T / original_len) for a window of T when null; YaRN's ramp and
        dynamic NTK read ``original_len`` (default train_len; ``reference_len`` holds the length in
        effect). ``eval.rope_scaling`` other than none replaces it for an evaluation."""
        super().__init__(dims)
        if dims.head_dim % 2:
            raise PosbenchError(f"{self.name} needs an even head dimension, got {dims.head_dim}")
        scaling(trained_scaling, "encoding.trained_scaling")
        if trained_factor is not None and not trained_factor >= 1:
            raise PosbenchError(f"encoding.trained_factor={trained_factor} is not valid; valid: null or >= 1")
        if original_len is not None and not (int(original_len) == original_len and 0 < original_len):
            raise PosbenchError(f"encoding.original_len={original_len} is not valid; valid: null or a positive "
                                "integer (the parent run's train_len)")
        self.base = float(base)
        self.pairing = check_pairing(str(pairing))  # see the module docstring
        self.trained_scaling, self.trained_factor, self.original_len = trained_scaling, trained_factor, original_len
        self.reference_len = int(original_len or dims.train_len)  # the context scalings are relative to
        self.scaling: tuple[str, float | None] = (trained_scaling, trained_factor)  # (kind, factor); see scaled()
        self._cache: tuple | None = None  # (scaling key, size, cos, sin), sized by the longest call
        self._rows: tuple | None = None  # (positions, scaling, cos, sin) of the last call: the forward's other layers

    @contextmanager
    def scaled(self, kind: str, factor: float | None = None):
        """Within the block, rotate with scaling ``kind`` and factor s; ``factor=None`` means
        s = max(1, T / train_len) for each window of T positions (``dynamic_ntk`` always does)."""
        scaling(kind)
        if factor is not None and not factor >= 1:
            raise PosbenchError(f"rope scaling factor must be >= 1 (1 = no scaling), got {factor}")
        old, self.scaling = self.scaling, (kind, factor)
        try:
            yield self
        finally:
            self.scaling = old

    def resolved_scaling(self, window_len: int) -> tuple[str, float]:
        """(kind, s) applied to a window of ``window_len`` positions; s = 1 becomes ``none``."""
        kind, factor = self.scaling
        s = scaling_factor(kind, factor, window_len, self.reference_len)
        if s == 1.0:
            return "none", 1.0
        return kind, s

    def inv_freq(self, kind: str, s: float, device=None, head_dim: int | None = None) -> torch.Tensor:
        """(head_dim/2,): every pair's frequency under scaling (kind, s)
        (:meth:`posbench.methods.RopeScaling.inv_freq`); ``pi`` scales the positions instead
        (:meth:`angle_table`), so its frequencies are the unscaled ones. ``head_dim``: the head
        size the frequencies are spread over (default the model's)."""
        rotation = Rotation(self.base, head_dim or self.dims.head_dim, self.reference_len)
        return scaling(kind).inv_freq(rotation, s, device)

    def angle_table(self, positions: torch.Tensor, kind: str, s: float):
        """cos, sin (T, hs/2) of every pair's angle at ``positions`` under scaling (kind, s):
        positions over the scaling's divisor (PI's s) times its frequencies, cos and sin times its
        attention factor (YaRN's)."""
        method = scaling(kind)
        return scaled_cos_sin(method, s, positions.float(), self.inv_freq(kind, s, positions.device))

    def _cos_sin(self, positions: torch.Tensor):
        """cos, sin (T, hs/2) at ``positions`` under the current scaling.

        Compiled (training, unscaled): computed in the graph from the positions, so no host value
        is read and the block compiles whole. Eager: rows of a table sized by the largest
        position (one host read per forward: every layer gets the same ``positions`` tensor and
        reuses the first layer's rows)."""
        if torch.compiler.is_compiling() and self.scaling[0] == "none":
            return self.angle_table(positions, "none", 1.0)
        if self._rows is not None and self._rows[0] is positions and self._rows[1] == self.scaling:
            return self._rows[2], self._rows[3]
        n = span(positions)[1] + 1  # T for positions 0..T-1; more with randomized positions (no scaling there)
        kind, s = self.resolved_scaling(n)
        key = (kind, s, positions.device)
        if self._cache is None or self._cache[0] != key or self._cache[1] < n:
            size = max(n, 2 * self.dims.train_len)
            cos, sin = self.angle_table(torch.arange(size, device=positions.device), kind, s)
            self._cache = (key, size, cos, sin)
        _, _, cos, sin = self._cache
        self._rows = (positions, self.scaling, cos[positions], sin[positions])
        return self._rows[2], self._rows[3]

    def rotate(self, q, k, positions, layer):
        cos, sin = self._cos_sin(positions)
        return apply_rotary(q, cos, sin, self.pairing), apply_rotary(k, cos, sin, self.pairing)

    # eval.extension: Self-Extend and ReRoPE regroup the positions of the trained rotation
    regroupable = True

    def extension_frequencies(self, layer: int, device=None) -> torch.Tensor:
        """The trained frequencies (``eval.extension`` takes no RoPE scaling beside it)."""
        return self.inv_freq("none", 1.0, device)

    def extended_attention(self, q, k, v, positions, layer):
        """As the base class, with ``interleaved`` pairs first laid out as half-split ones (the same
        permutation of q's and k's dims leaves every logit as it is)."""
        if self.pairing == "interleaved":
            half = torch.cat((torch.arange(0, q.shape[-1], 2), torch.arange(1, q.shape[-1], 2))).to(q.device)
            q, k = q[..., half], k[..., half]
        return super().extended_attention(q, k, v, positions, layer)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, pairing={self.pairing}"


PARTIAL_FORMS = ("highest", "neox")


@register
class PartialRotary(Rotary):
    """RoPE on a fraction p of each head's rotary pairs; the other pairs are not rotated and
    carry no position (NoPE channels). Two forms, both with r = floor(p * hs/2) rotated pairs:

    * ``highest`` (p-RoPE; Barbero et al., ICLR 2025, "Round and Round We Go! What makes Rotary
      Positional Encodings useful?", ``apply_p_rope`` in their code): RoPE's own frequencies
      theta_i = base^(-2i/hs) for the r highest (i < r); the lowest hs/2 - r, whose rotations are
      so slow that they act as semantic channels which drift over long contexts, are removed
      (frequency 0). p = 1 is RoPE. The paper trains p = 0.25 and 0.75; 0.75 is the default.
    * ``neox`` (GPT-NeoX's ``rotary_pct``, Black et al. 2022; Hugging Face ``partial_rotary_factor``):
      the first 2r dims rotated with frequencies base^(-2i/(2r)), i < r: the whole range of
      frequencies packed into fewer pairs (GPT-NeoX 20B and Pythia use 0.25). NeoX rotates dims
      [0, 2r) in their own rotate-half layout; here pair i is laid out as ``pairing`` says, the
      same function up to a fixed permutation of each head's q and k dims (as for ``pairing``;
      ``tests/test_partial_rope.py`` checks the logits against NeoX's layout).

    RoPE scalings at inference apply to the rotated pairs as for ``rope``, with the frequencies of
    the form (``ntk`` and ``yarn`` on the head size the frequencies are spread over: hs for
    ``highest``, 2r for ``neox``); YaRN's attention factor multiplies every pair, so the logits
    scale as for ``rope``.
    """

    name = "p_rope"
    paper = "Barbero et al. 2025, Round and Round We Go! (p-RoPE); GPT-NeoX rotary_pct"
    description = ("rope on the highest fraction p of its frequencies (or NeoX's first p of the dims), "
                   "the rest unrotated")

    def __init__(self, dims: ModelDims, fraction: float = 0.75, form: str = "highest", base: float = 10000.0,
                 pairing: str = "half"):
        super().__init__(dims, base, pairing)
        if form not in PARTIAL_FORMS:
            raise PosbenchError(f"p_rope form {form!r} is not valid; valid choices: {', '.join(PARTIAL_FORMS)}")
        pairs = int(float(fraction) * (dims.head_dim // 2))
        if not 0 < fraction <= 1 or pairs < 1:
            raise PosbenchError(f"p_rope fraction must be in (0, 1] and rotate at least one of the "
                                f"{dims.head_dim // 2} pairs of a head, got {fraction}")
        self.fraction, self.form, self.pairs = float(fraction), form, pairs

    def inv_freq(self, kind: str, s: float, device=None, head_dim: int | None = None) -> torch.Tensor:
        """(hs/2,): the rotated pairs' frequencies under scaling (kind, s), RoPE's spread over hs
        (``highest``) or over the 2r rotated dims (``neox``); zeros for the other pairs."""
        spread = self.dims.head_dim if self.form == "highest" else 2 * self.pairs
        freq = super().inv_freq(kind, s, device, spread)
        out = torch.zeros(self.dims.head_dim // 2, device=device)
        out[:self.pairs] = freq[:self.pairs]
        return out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fraction={self.fraction}, form={self.form}"


@register
class HybridRotary(Rotary):
    """RoPE in most layers and no position encoding (NoPE) in every ``nope_every``-th: layer l is
    NoPE where (l + 1) % nope_every == 0. Llama 4's "iRoPE" interleaves them this way, one NoPE
    layer in four (Hugging Face ``Llama4TextConfig.no_rope_layers``, default
    ``(l + 1) % 4 != 0`` for RoPE); Yang et al. 2025 ("Rope to Nope and Back Again: A New Hybrid
    Attention Strategy", arXiv 2501.18795) study the same hybrid. Llama 4 also scales the NoPE
    layers' queries at long lengths (``attn_temperature_tuning``); that is not built here:
    ``model.length_scaling=logn`` is the log-n scaling posbench has, on every layer. RoPE
    scalings at inference apply to the RoPE layers. A model of fewer than ``nope_every`` layers
    has no NoPE layer and is RoPE. ``window`` > 0 gives the RoPE layers sliding-window attention
    over that many keys and leaves the NoPE layers global: RNoPE-SWA (Yang et al. 2025), the
    layout of Cohere's Command A (three windowed RoPE layers to one global NoPE layer:
    ``nope_every=4``)."""

    name = "rope_nope"
    paper = "Llama 4 iRoPE (Meta 2025); Yang et al. 2025, Rope to Nope and Back Again"
    description = "rope in most layers, none in every nope_every-th (Llama 4: one layer in four)"

    def __init__(self, dims: ModelDims, nope_every: int = 4, window: int = 0, base: float = 10000.0,
                 pairing: str = "half"):
        super().__init__(dims, base, pairing)
        if int(nope_every) != nope_every or nope_every < 2:
            raise PosbenchError(f"rope_nope nope_every must be an integer >= 2 (every layer NoPE is encoding=nope), "
                                f"got {nope_every}")
        if int(window) != window or window < 0:
            raise PosbenchError(f"rope_nope window must be an integer >= 0 (0: no window), got {window}")
        self.nope_every, self.window = int(nope_every), int(window)

    def attention_window(self, layer: int) -> int:
        return 0 if self.is_nope(layer) else self.window

    def is_nope(self, layer: int) -> bool:
        return (layer + 1) % self.nope_every == 0

    def extension_frequencies(self, layer: int, device=None) -> torch.Tensor:
        """Zeros in the NoPE layers: Self-Extend and ReRoPE leave them as trained."""
        freq = super().extension_frequencies(layer, device)
        return torch.zeros_like(freq) if self.is_nope(layer) else freq

    def check_extension(self, ext) -> None:
        super().check_extension(ext)
        if ext.sets_positions and self.window:
            raise PosbenchError(f"eval.extension={ext.method} regroups the positions of global attention; this "
                                f"rope_nope run has windowed RoPE layers (window={self.window}); valid here: "
                                "eval.extension=none or logn")

    def rotate(self, q, k, positions, layer):
        return (q, k) if self.is_nope(layer) else super().rotate(q, k, positions, layer)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, nope_every={self.nope_every}, window={self.window}"


def xpos_zeta(head_dim: int) -> torch.Tensor:
    """zeta_i = (2i/hs + 0.4) / 1.4 for i < hs/2 (Sun et al. 2022). -> (hs/2,)."""
    return (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim + 0.4) / 1.4


def xpos_scale(positions: torch.Tensor, head_dim: int, scale_base: float) -> torch.Tensor:
    """zeta_i^(n / B) at each position n. positions: (T,) -> (T, hs/2)."""
    zeta = xpos_zeta(head_dim).to(positions.device)
    return zeta[None, :] ** (positions.float()[:, None] / scale_base)


@register
class XPos(Rotary):
    """RoPE with q at position n times zeta^(n/B) and k at m times zeta^(-m/B), so each pair's
    share of q.k decays as zeta_i^((n - m)/B) with the distance.

    The factors are applied at positions centred on the window (as in the authors' torchscale
    code): q.k depends on n - m only, so this changes no logit, and keeps zeta^(+-n/B) inside
    fp32 range at twice the length. Under ``pi`` the decay, like the rotation, sees p / s;
    the other scalings change frequencies only and leave the decay at the real positions.
    """

    name = "xpos"
    paper = "Sun et al. 2022, A Length-Extrapolatable Transformer"
    description = "rope whose q.k decays exponentially with i - j (q scaled up, k down by zeta^(pos/B))"

    def __init__(self, dims: ModelDims, base: float = 10000.0, scale_base: float = 512.0,
                 pairing: str = "half"):
        super().__init__(dims, base, pairing)
        if not scale_base > 0:
            raise PosbenchError(f"xpos scale_base must be > 0, got {scale_base}")
        self.scale_base = float(scale_base)

    regroupable = False  # q and k also decay with their positions: not a pure rotation

    def rotate(self, q, k, positions, layer):
        cos, sin = self._cos_sin(positions)
        kind, s = ("none", 1.0) if self.scaling[0] == "none" else self.resolved_scaling(span(positions)[1] + 1)
        centred = positions.float() - (positions.min() + positions.max()).float() / 2
        scale = xpos_scale(centred / s if kind == "pi" else centred, self.dims.head_dim, self.scale_base)
        return (apply_rotary(q, cos * scale, sin * scale, self.pairing),
                apply_rotary(k, cos / scale, sin / scale, self.pairing))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scale_base={self.scale_base}"
