"""Rotary encodings that train with RoPE's frequencies changed (``rotate`` hook): HoPE, Resonance
RoPE and clipped RoPE. Each is RoPE (:class:`~posbench.encodings.rotary.Rotary`) with
theta_i = base^(-2i/hs) replaced by theta'_i, pair i being laid out as ``pairing`` says:

==================  ===============================================================  ======================
encoding            theta'_i                                                         source
==================  ===============================================================  ======================
``hope``            theta_i where its wavelength 2 pi / theta_i <= L, else 0         Chen et al. 2025 (ACL)
``resonance_rope``  2 pi / round(2 pi / theta_i): every wavelength a whole number    Wang et al. 2024
                    of tokens
``clip_rope``       theta_i times a raised-cosine taper from 1 to 0 over the lowest  Li et al. 2026
                    n pairs (n: those whose wavelength exceeds L)                    (arXiv 2602.05258)
==================  ===============================================================  ======================

L is the training length (``train.train_len``) unless the encoding's ``cutoff_len`` names
another. All three stay pure rotations, so q.k depends on i - j only and Self-Extend, ReRoPE and
the RoPE scalings at inference apply as for ``rope`` (on the changed frequencies, the scaling
first and the change after, as Resonance YaRN and the clipped RoPE's dynamic scaling do in their
authors' code).
"""

from __future__ import annotations

import math

import torch

from ..errors import PosbenchError
from ..methods import scaling
from .base import ModelDims, register
from .rotary import Rotary, scaled_cos_sin


def wavelengths(head_dim: int, base: float) -> list[float]:
    """2 pi / theta_i = 2 pi base^(2i/hs), in float64, for i < hs/2 (shortest first)."""
    return [2 * math.pi * base ** (2 * i / head_dim) for i in range(head_dim // 2)]


def cutoff(name: str, cutoff_len: int | None, dims: ModelDims) -> int:
    """L: ``cutoff_len``, or the training length when it is None."""
    if cutoff_len is None:
        return int(dims.train_len)
    if int(cutoff_len) != cutoff_len or cutoff_len < 1:
        raise PosbenchError(f"{name} cutoff_len must be a positive integer (null: train.train_len), got {cutoff_len}")
    return int(cutoff_len)


@register
class HighFrequencyRotary(Rotary):
    """HoPE (Chen et al., ACL 2025, "HoPE: A Novel Positional Encoding Without Long-Term Decay for
    Enhanced Context Awareness and Extrapolation", arXiv 2410.21216): RoPE that keeps only its
    high-frequency components and makes the others position-independent.

    The paper traces the U-shaped attention RoPE models learn, and the shortcuts that limit their
    extrapolation, to learned low-frequency ("activated") components, and finds the lowest ones
    settle into near-constant channels that carry semantics rather than position; HoPE makes those
    components position-independent and keeps only the high frequencies. The rule built here:
    pair i rotates by theta_i = base^(-2i/hs) exactly when it completes a whole period within the
    training length, 2 pi / theta_i <= L (theta_i L >= 2 pi); every other pair is not rotated
    (frequency 0: q_i.k_i, the identity in place of the rotation), so the
    r = #{i : 2 pi base^(2i/hs) <= L} highest pairs rotate, as in ``p_rope`` with r set by L
    instead of a fraction. No reference code by the authors was found; the cutoff is this
    reading of the paper's "high-frequency" components. No parameters.

    ``hope`` here is Chen et al.'s; other schemes of that name (a hyperbolic RoPE, arXiv
    2509.05218; a hybrid for vision-language models, arXiv 2505.20444) are not this one. ``cutoff_len``:
    L (default ``train.train_len``); set it to the parent's length when a run is fine-tuned
    longer and should keep the parent's rotating pairs. A model whose L leaves no pair rotating
    (L < 2 pi) is refused.
    """

    name = "hope"
    paper = "Chen et al. 2025, HoPE: A Novel Positional Encoding Without Long-Term Decay (ACL)"
    description = "rope on the pairs whose wavelength fits in the training length; the rest unrotated"

    def __init__(self, dims: ModelDims, cutoff_len: int | None = None, base: float = 10000.0,
                 pairing: str = "half"):
        super().__init__(dims, base, pairing)
        self.cutoff_len = cutoff(self.name, cutoff_len, dims)
        self.pairs = sum(w <= self.cutoff_len for w in wavelengths(dims.head_dim, self.base))
        if self.pairs < 1:
            raise PosbenchError(f"hope rotates the pairs whose wavelength 2 pi base^(2i/hs) is at most L = "
                                f"{self.cutoff_len}; none is (the shortest is 2 pi): valid: cutoff_len >= 7")

    def inv_freq(self, kind: str, s: float, device=None, head_dim: int | None = None) -> torch.Tensor:
        """(hs/2,): RoPE's frequencies under scaling (kind, s) on the r rotating pairs, 0 on the rest."""
        freq = super().inv_freq(kind, s, device, head_dim).clone()
        freq[self.pairs:] = 0.0
        return freq

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, cutoff_len={self.cutoff_len}, pairs={self.pairs}"


def resonance_wavelengths(freq: torch.Tensor) -> torch.Tensor:
    """round(2 pi / theta_i), the nearest whole number of tokens (``torch.round``: halves to even),
    at least 1. -> same shape as ``freq``."""
    return torch.round(2 * math.pi / freq).clamp_min(1.0)


@register
class ResonanceRotary(Rotary):
    """Resonance RoPE (Wang et al. 2024, "Resonance RoPE: Improving Context Length Generalization
    of Large Language Models", arXiv 2403.00071; code: sheryc/resonance_rope,
    ``ResonanceEmbedding``): every wavelength rounded to a whole number of tokens,

        lambda_i = round(2 pi / theta_i),  theta'_i = 2 pi / lambda_i,

    for every pair (the reference rounds them all, including those longer than the training
    length), with ``torch.round`` on the fp32 frequencies as the reference does. Each pair's angle
    then repeats exactly every lambda_i positions, so a pair meets past the training length only
    the angles it met within it (for lambda_i <= L). The angle is computed as
    (p mod lambda_i) 2 pi / lambda_i, the same value the reference gets by tiling one period
    (``compute_freqs``), which also keeps it exact at long positions. No parameters.

    RoPE scalings at inference round the scaled frequencies (the reference's Resonance YaRN and
    NTK variants round after scaling); ``pi`` divides the positions, whose angles are then not
    whole periods.
    """

    name = "resonance_rope"
    paper = "Wang et al. 2024, Resonance RoPE: Improving Context Length Generalization of LLMs"
    description = "rope with every wavelength rounded to a whole number of tokens"

    def __init__(self, dims: ModelDims, base: float = 10000.0, pairing: str = "half"):
        super().__init__(dims, base, pairing)

    def wavelengths(self, kind: str = "none", s: float = 1.0, device=None) -> torch.Tensor:
        """(hs/2,) lambda_i, whole numbers, under scaling (kind, s)."""
        return resonance_wavelengths(super().inv_freq(kind, s, device))

    def inv_freq(self, kind: str, s: float, device=None, head_dim: int | None = None) -> torch.Tensor:
        return 2 * math.pi / resonance_wavelengths(super().inv_freq(kind, s, device, head_dim))

    def angle_table(self, positions: torch.Tensor, kind: str, s: float):
        """As RoPE's, each angle taken as (p mod lambda_i) 2 pi / lambda_i."""
        period = self.wavelengths(kind, s, positions.device)
        angle = lambda pos, _: torch.remainder(pos[:, None], period[None, :]) * (2 * math.pi / period)[None, :]  # noqa: E731
        return scaled_cos_sin(scaling(kind), s, positions.float(), period, angle)


def clip_taper(pairs: int, clipped: int) -> torch.Tensor:
    """(hs/2,) factors on theta_i: 1 on the highest pairs, and over the lowest n = ``clipped`` pairs
    0.5 (1 + cos(pi j / (n - 1))), j = 0 .. n-1: 1 at the first clipped pair, 0 at the lowest
    (``torch.linspace(0, pi, n)`` as the reference; n = 1 gives 1, nothing clipped)."""
    taper = torch.ones(pairs)
    if clipped > 0:
        taper[pairs - clipped:] = 0.5 * (1.0 + torch.cos(torch.linspace(0.0, math.pi, clipped)))
    return taper


@register
class ClippedRotary(Rotary):
    """Clipped RoPE (Li, Ren, Yuille and Wang 2026, "CoPE: Clipped RoPE as A Scalable Free Lunch
    for Long Context LLMs", arXiv 2602.05258; code: hrlics/CoPE, ``LlamaRotaryEmbedding``): RoPE
    with its low frequencies softly clipped,

        theta'_i = theta_i * 0.5 (1 + cos(pi j / (n - 1))),  j = i - (hs/2 - n),  for the lowest n pairs,

    theta'_i = theta_i above them: a raised-cosine taper from 1 (the highest clipped pair, kept)
    to 0 (the lowest, not rotated), which removes the components whose period exceeds the
    training window (out-of-distribution angles past it) without the ringing over distance a
    hard cut (theta'_i = 0 for all n, the paper's HardClip) gives. No parameters.

    n (``clipped``): an integer is that many of the lowest pairs, as the reference's
    ``clip_low_n`` (20 of Llama 3's 64 pairs, fixed in their code); null (the default) is the
    number of pairs whose wavelength 2 pi / theta_i exceeds L, the components the paper names
    as the cause of the out-of-distribution angles, with L = ``cutoff_len`` (default
    ``train.train_len``). A scaling at inference is tapered after it, as the reference re-applies
    the taper to the dynamically scaled frequencies.

    Named ``clip_rope``, not the authors' "CoPE": posbench's ``cope`` is Golovneva et al.'s
    Contextual Position Encoding (2024), a different scheme.
    """

    name = "clip_rope"
    paper = "Li et al. 2026, CoPE: Clipped RoPE as A Scalable Free Lunch for Long Context LLMs"
    description = "rope whose lowest frequencies taper to 0 by a raised cosine (soft clipping)"

    def __init__(self, dims: ModelDims, clipped: int | None = None, cutoff_len: int | None = None,
                 base: float = 10000.0, pairing: str = "half"):
        super().__init__(dims, base, pairing)
        pairs = dims.head_dim // 2
        self.cutoff_len = cutoff(self.name, cutoff_len, dims)
        if clipped is None:
            clipped = sum(w > self.cutoff_len for w in wavelengths(dims.head_dim, self.base))
        if int(clipped) != clipped or not 0 <= clipped <= pairs:
            raise PosbenchError(f"clip_rope clipped must be an integer in 0..{pairs} (the pairs of a head) or null "
                                f"(those whose wavelength exceeds cutoff_len), got {clipped}")
        self.clipped = int(clipped)
        self.register_buffer("taper", clip_taper(pairs, self.clipped), persistent=False)

    def inv_freq(self, kind: str, s: float, device=None, head_dim: int | None = None) -> torch.Tensor:
        """(hs/2,): RoPE's frequencies under scaling (kind, s) times the taper."""
        freq = super().inv_freq(kind, s, device, head_dim)
        return freq * self.taper.to(freq.device)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, clipped={self.clipped}, cutoff_len={self.cutoff_len}"
