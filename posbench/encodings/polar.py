"""PoPE, polar coordinate position embeddings (``rotate`` hook): content sets the magnitudes only.

Gopalakrishnan, Csordás, Schmidhuber & Mozer, "Decoupling the 'What' and 'Where' With Polar
Coordinate Positional Embeddings", arXiv 2509.10534 (2025); reference code: x-transformers
(lucidrains), ``PolarEmbedding`` and ``apply_polar_pos_emb``. RoPE rotates the pairs of q and k,
so a pair's angle mixes content (the pair's own angle) with position. PoPE keeps content out of
the angle: each of the head's d components c of q (and of k) becomes a complex number with
magnitude softplus(q_c) and phase t theta_c, the key's phase shifted by a learned delta_c:

    q~_tc = softplus(q_tc) e^{i t theta_c},    k~_sc = softplus(k_sc) e^{i (s theta_c + delta_c)},
    logit(t, s) = Re sum_c q~_tc conj(k~_sc) / sqrt(d)
                = sum_c softplus(q_tc) softplus(k_sc) cos((t - s) theta_c - delta_c) / sqrt(d),

with d frequencies theta_c = base^(-c/d), c = 0 .. d-1 (twice RoPE's d/2), and delta (one per
head and frequency) clamped to [-2 pi, 0]. As the reference does it, the hook returns the real
and imaginary parts side by side, q and k of 2d dims (the values keep d), so every attention
kernel computes it as a plain dot product; the logit scale stays 1/sqrt(d). The reference keeps
one delta for the whole model (its ``PolarEmbedding`` is built once per layer stack), initialised
to 0 (``bias_init=zero``) or uniform in [-2 pi, 0] (``polar_bias_uniform_init``,
``bias_init=uniform``); both are options here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import PosbenchError
from .base import ModelDims, PositionEncoding, register

BIAS_INITS = ("zero", "uniform")


@register
class Polar(PositionEncoding):
    name = "pope"
    paper = "Gopalakrishnan et al. 2025, Polar Coordinate Position Embeddings (PoPE)"
    description = "q, k as complex numbers: softplus magnitudes from content, phases t theta_c from position only"

    def __init__(self, dims: ModelDims, base: float = 10000.0, bias_init: str = "zero"):
        super().__init__(dims)
        if bias_init not in BIAS_INITS:
            raise PosbenchError(f"encoding.bias_init={bias_init!r} is not valid; "
                                f"valid choices: {', '.join(BIAS_INITS)}")
        hs = dims.head_dim
        self.base, self.bias_init = float(base), bias_init
        self.register_buffer("inv_freq", self.base ** (-torch.arange(hs, dtype=torch.float32) / hs), persistent=False)
        self.phase = nn.Parameter(torch.zeros(dims.n_heads, 1, hs))  # delta, (H, 1, d)
        if bias_init == "uniform":
            nn.init.uniform_(self.phase, -2 * math.pi, 0.0)

    def rotate(self, q, k, positions, layer):
        """(B, H, T, d) q, k -> (B, H, T, 2d): [m cos(phase), m sin(phase)], m = softplus of each."""
        angles = positions.float()[:, None] * self.inv_freq  # (T, d)
        shifted = angles + self.phase.clamp(-2 * math.pi, 0.0)  # (H, T, d)
        mq, mk = F.softplus(q.float()), F.softplus(k.float())
        q2 = torch.cat((mq * angles.cos(), mq * angles.sin()), dim=-1)
        k2 = torch.cat((mk * shifted.cos(), mk * shifted.sin()), dim=-1)
        return q2.to(q.dtype), k2.to(k.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, base={self.base}, bias_init={self.bias_init}"
