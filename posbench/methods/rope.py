"""RoPE's frequencies and their scalings at inference: one class each, registered by its
``eval.rope_scaling`` name.

A rotary model trained on windows of L tokens (``original_len``) can be stretched to longer
windows without retraining. For a factor s >= 1:

===============  ==========================================================  =======================
scaling          what changes                                                source
===============  ==========================================================  =======================
``pi``           positions p -> p / s                                        Chen et al. 2023 (PI)
``ntk``          base b -> b * s^(hs / (hs - 2))                             bloc97 2023 (NTK-aware)
``dynamic_ntk``  ``ntk`` with s = max(1, T / L) for a window of T            emozilla 2023
``yarn``         NTK-by-parts: pairs that turn more than beta_fast = 32      Peng et al. 2023 (YaRN)
                 times over L are kept, those that turn less than
                 beta_slow = 1 time are interpolated (/ s), a ramp linear
                 in the pair index between; q and k times 0.1 ln s + 1
``llama3``       wavelengths above L / 1 divided by s, below L / 4 kept,     Meta 2024 (Llama 3)
                 a smooth blend between
===============  ==========================================================  =======================

s = 1 is plain RoPE for every scaling. A scaling is a setting of the rotation, not a parameter:
checkpoints are unchanged. This module is the one implementation: posbench's rotary encodings
(:meth:`posbench.encodings.rotary.Rotary.angle_table`) rotate with a class's :meth:`~RopeScaling.inv_freq`,
:meth:`~RopeScaling.position_divisor` and :meth:`~RopeScaling.attention_factor`, and a pretrained
model's own rotary module is handed :meth:`~RopeScaling.frequencies` (the frequencies with the
position divisor folded in, which is what a module that rotates position p by p theta can hold)
(:mod:`posbench.model.pretrained`). Hugging Face's ``ROPE_INIT_FUNCTIONS`` are the reference the
tests hold every class to (``linear``, ``dynamic``, ``yarn``, ``llama3``); it has no static NTK,
so for ``ntk`` the NTK-aware base written out is the reference.

Which scaling a name means: :func:`posbench.methods.scaling`; a scaling from outside the package
is a subclass of :class:`RopeScaling` declared with its name (``class Mine(RopeScaling,
name="mine")``), found through the entry-point group ``posbench.rope_scalings`` or its import path
(``eval.rope_scaling=my_package.scalings:Mine``), as a method is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

SCALING_REGISTRY: dict[str, type[RopeScaling]] = {}  # eval.rope_scaling name -> its class, in registration order

YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0  # rotations over original_len bounding the ramp (Peng et al. 2023)
LLAMA3_LOW_FREQ_FACTOR, LLAMA3_HIGH_FREQ_FACTOR = 1.0, 4.0  # Meta's apply_scaling and HF's defaults


def rope_inv_freq(head_dim: int, base: float, device=None) -> torch.Tensor:
    """theta_i = base^(-2i/hs) for i < hs/2 (Su et al. 2021, eq. 15). -> (hs/2,)."""
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)


def ntk_base(base: float, factor: float, head_dim: int) -> float:
    """NTK-aware base: b' = b * s^(hs / (hs - 2)), so the lowest frequency is interpolated by s."""
    return base * factor ** (head_dim / (head_dim - 2))


def yarn_correction_dim(rotations: float, head_dim: int, base: float, train_len: int) -> float:
    """The (fractional) pair index i whose frequency turns ``rotations`` times over ``train_len``
    positions: train_len base^(-2i/hs) / (2 pi) = rotations, so
    i = hs ln(train_len / (2 pi rotations)) / (2 ln base)
    (``find_correction_dim`` in jquesnelle/yarn and Hugging Face ``_compute_yarn_parameters``)."""
    return head_dim * math.log(train_len / (2 * math.pi * rotations)) / (2 * math.log(base))


def yarn_ramp(head_dim: int, base: float, train_len: int, beta_fast: float = YARN_BETA_FAST,
              beta_slow: float = YARN_BETA_SLOW) -> torch.Tensor:
    """gamma_i, the share of pair i kept at its own frequency: 1 for the pairs below
    low = floor(i at beta_fast rotations), 0 above high = ceil(i at beta_slow rotations), linear
    in the pair index i between (low clamped at 0, high at hs - 1; high = low + 0.001 if they
    meet). This is the reference ramp: ``find_correction_range`` (floor/ceil, Hugging Face's
    default ``truncate=True``) and 1 - ``linear_ramp_mask`` of jquesnelle/yarn
    (``scaled_rope/LlamaYaRNScaledRotaryEmbedding.py``), the code behind Peng et al. 2023.
    -> (hs/2,)."""
    low = max(math.floor(yarn_correction_dim(beta_fast, head_dim, base, train_len)), 0)
    high = min(math.ceil(yarn_correction_dim(beta_slow, head_dim, base, train_len)), head_dim - 1)
    if low == high:
        high += 0.001  # as the reference: no division by zero
    index = torch.arange(head_dim // 2, dtype=torch.float32)
    return 1 - ((index - low) / (high - low)).clamp(0.0, 1.0)


def yarn_inv_freq(head_dim: int, base: float, factor: float, train_len: int, device=None) -> torch.Tensor:
    """NTK-by-parts (Peng et al. 2023): h(theta_i) = (1 - gamma_i) theta_i / s + gamma_i theta_i with
    gamma from :func:`yarn_ramp`. The paper writes gamma as linear in r = train_len / wavelength;
    its code (and Hugging Face's) ramps linearly in the pair index between whole indices, which
    is what models are run with, so that is what this follows. -> (hs/2,)."""
    inv_freq = rope_inv_freq(head_dim, base, device)
    gamma = yarn_ramp(head_dim, base, train_len).to(inv_freq.device)
    return (1 - gamma) * inv_freq / factor + gamma * inv_freq


def yarn_attention_factor(factor: float) -> float:
    """sqrt(1/t) = 0.1 ln s + 1 (1 for s <= 1), applied to cos and sin, hence to q and k, so the
    logits scale by 1/t (Peng et al. 2023; ``get_mscale`` in jquesnelle/yarn, Hugging Face's
    default ``attention_factor``)."""
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def llama3_inv_freq(inv_freq: torch.Tensor, factor: float, original_len: int,
                    low_freq_factor: float = LLAMA3_LOW_FREQ_FACTOR,
                    high_freq_factor: float = LLAMA3_HIGH_FREQ_FACTOR) -> torch.Tensor:
    """Llama 3's RoPE scaling of the frequencies ``inv_freq`` (Meta 2024; ``apply_scaling`` in
    meta-llama/llama-models, Hugging Face ``_compute_llama3_parameters``): with lambda = 2 pi / theta
    and L = ``original_len``, theta where lambda < L / high_freq_factor, theta / s where
    lambda > L / low_freq_factor, else (1 - a) theta / s + a theta, a = (L / lambda -
    low_freq_factor) / (high_freq_factor - low_freq_factor). A zero frequency (a pair without
    positions) stays zero. -> the shape of ``inv_freq``."""
    theta = inv_freq.float()
    wavelen = 2 * math.pi / theta
    smooth = (original_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    mid = (1 - smooth) * theta / factor + smooth * theta
    out = torch.where(wavelen > original_len / low_freq_factor, theta / factor, mid)
    return torch.where(wavelen < original_len / high_freq_factor, theta, out)


@dataclass(frozen=True)
class Rotation:
    """What a scaling reads of the rotation it scales: RoPE's ``base``, the ``head_dim`` its
    frequencies are spread over (base^(-2i/head_dim)), and ``original_len``, the context s is
    relative to (YaRN's ramp and Llama 3's bands read it too)."""

    base: float
    head_dim: int
    original_len: int

    def trained(self, device=None) -> torch.Tensor:
        """The unscaled frequencies (:func:`rope_inv_freq`). -> (head_dim/2,)."""
        return rope_inv_freq(self.head_dim, self.base, device)


class RopeScaling:
    """A RoPE scaling at inference; this class is ``none``, the rotation as trained. A subclass
    names itself (``class PI(RopeScaling, name="pi")``) and overrides what it changes: the
    frequencies (:meth:`inv_freq`), the positions (:meth:`position_divisor`), the scale of q and k
    (:meth:`attention_factor`); :meth:`factor` says which s a window of T positions gets."""

    name: ClassVar[str] = "none"
    paper: ClassVar[str] = ""  # its paper and reference code, for listings
    per_window: ClassVar[bool] = False  # s = max(1, T / L) at every window, whatever eval.rope_factor says

    def __init_subclass__(cls, name: str | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if name is not None:
            cls.name = name
            SCALING_REGISTRY[name] = cls

    def factor(self, requested: float | None, window_len: int, original_len: int) -> float:
        """s in effect for a window of ``window_len`` positions: 1 here (``none``)."""
        return 1.0

    def inv_freq(self, rotation: Rotation, s: float, device=None) -> torch.Tensor:
        """(head_dim/2,): each pair's frequency at s; the positions' share of the scaling is
        :meth:`position_divisor`'s."""
        return rotation.trained(device)

    def position_divisor(self, s: float) -> float:
        """Each position p is rotated as p / this (PI's s; 1 here)."""
        return 1.0

    def attention_factor(self, s: float) -> float:
        """The factor on cos and sin, hence on q and k (the logits scale by its square)."""
        return 1.0

    def frequencies(self, rotation: Rotation, s: float, device=None) -> torch.Tensor:
        """What a rotary module that turns position p by p theta must hold for this scaling at s:
        :meth:`inv_freq` over :meth:`position_divisor` (the trained frequencies at s = 1)."""
        if s == 1.0:
            return rotation.trained(device)
        return self.inv_freq(rotation, s, device) / self.position_divisor(s)


class NoScaling(RopeScaling, name="none"):
    """The rotation as trained."""


class Scaled(RopeScaling):
    """A scaling by s = ``eval.rope_factor``, or max(1, T / L) for each window of T when null."""

    def factor(self, requested: float | None, window_len: int, original_len: int) -> float:
        if self.per_window or requested is None:
            return max(1.0, window_len / original_len)
        return float(requested)


class PI(Scaled, name="pi"):
    """**Position interpolation** (Chen et al. 2023, "Extending Context Window of Large Language
    Models via Positional Interpolation"; Hugging Face ``rope_type: linear``): p -> p / s."""

    paper = "Chen et al. 2023, Extending Context Window of LLMs via Positional Interpolation"

    def position_divisor(self, s: float) -> float:
        return s


class NTK(Scaled, name="ntk"):
    """**NTK-aware scaling** (bloc97 2023, reddit r/LocalLLaMA "NTK-Aware Scaled RoPE"): the base
    b -> b s^(hs / (hs - 2)) (:func:`ntk_base`), so the lowest frequency is interpolated by s and
    the highest kept. Hugging Face has no static form; the formula is its own reference."""

    paper = "bloc97 2023, NTK-Aware Scaled RoPE"

    def inv_freq(self, rotation: Rotation, s: float, device=None) -> torch.Tensor:
        return rope_inv_freq(rotation.head_dim, ntk_base(rotation.base, s, rotation.head_dim), device)


class DynamicNTK(NTK, name="dynamic_ntk"):
    """**Dynamic NTK** (emozilla 2023; Hugging Face ``rope_type: dynamic``): :class:`NTK` at
    s = max(1, T / L) for each window of T, whatever ``eval.rope_factor`` says."""

    paper = "emozilla 2023, Dynamically Scaled RoPE"
    per_window = True


class YaRN(Scaled, name="yarn"):
    """**YaRN** (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language
    Models"; jquesnelle/yarn, Hugging Face ``rope_type: yarn``): NTK-by-parts frequencies
    (:func:`yarn_inv_freq`) and q and k times 0.1 ln s + 1 (:func:`yarn_attention_factor`)."""

    paper = "Peng et al. 2023, YaRN; jquesnelle/yarn"

    def inv_freq(self, rotation: Rotation, s: float, device=None) -> torch.Tensor:
        return yarn_inv_freq(rotation.head_dim, rotation.base, s, rotation.original_len, device)

    def attention_factor(self, s: float) -> float:
        return yarn_attention_factor(s)


class Llama3(Scaled, name="llama3"):
    """**Llama 3's scaling** (Meta 2024, "The Llama 3 Herd of Models"; ``apply_scaling`` in
    meta-llama/llama-models, Hugging Face ``rope_type: llama3``): :func:`llama3_inv_freq`, low
    frequency factor 1 and high 4. The same method as ``eval.extension=llama3``, which runs it
    through the extension kernel on the frequencies a model has (its rows keep that name)."""

    paper = "Meta 2024, The Llama 3 Herd of Models; meta-llama/llama-models apply_scaling"

    def inv_freq(self, rotation: Rotation, s: float, device=None) -> torch.Tensor:
        return llama3_inv_freq(rotation.trained(device), s, rotation.original_len)
