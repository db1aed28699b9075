"""Fourier Position Embedding (FoPE, ``rotate`` hook): each rotary pair a Fourier series of RoPE's
frequencies instead of one frequency, the frequencies too low to finish a period within the
training length removed."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import PosbenchError
from ..methods import rope_inv_freq
from .base import ModelDims, PositionEncoding, register
from .rotary import apply_rotary


def fope_frequencies(head_dim: int, base: float, cutoff_len: int) -> torch.Tensor:
    """RoPE's theta_D = base^(-2D/hs) at or above the floor 2 pi / L (the lower ones clipped to 0
    and dropped), highest first. -> (M,)."""
    theta = rope_inv_freq(head_dim, base)
    return theta[theta >= 2 * math.pi / cutoff_len]


def step_eye(inputs: int, outputs: int) -> torch.Tensor:
    """(M, N): output pair d starts as input frequency d * ceil(M / N) (the identity when M = N)."""
    eye, step = torch.zeros(inputs, outputs), math.ceil(inputs / outputs)
    for d in range(outputs):
        if d * step < inputs:
            eye[d * step, d] = 1.0
    return eye


@register
class FourierRotary(PositionEncoding):
    """FoPE (Hua et al. 2024, "Fourier Position Embedding: Enhancing Attention's Periodic Extension
    for Length Generalization", arXiv 2412.17739; code: TsinghuaC3I/Fourier-Position-Embedding,
    ``FourierEmbedding`` in ``olmo/model.py``, run with its configs' ``rope_clamp_floor_freq``,
    ``rope_clamp_floor_to_zero``, ``fourier_separate_basis``, ``fourier_separate_head``,
    ``fourier_ignore_zero`` and ``fourier_init=eye_xavier_norm``).

    Frequencies: RoPE's theta_D = base^(-2D/hs); those below the floor 2 pi / L (wavelength
    longer than the training length L, undertrained) are clipped to 0 and dropped, leaving M.
    Each of the first N = min(M, hs/4) pairs d of head h gets at position n

        C_d(n) = sum_D a^cos_{h,D,d} cos(theta_D n),   S_d(n) = sum_D a^sin_{h,D,d} sin(theta_D n),

    and (x_d, x_{d+hs/2}) -> (x_d C_d - x_{d+hs/2} S_d, x_{d+hs/2} C_d + x_d S_d), on q and k alike;
    the other hs/2 - N pairs get C = S = 1 (the reference pads both series with ones), a
    position-independent channel. Unlike RoPE, q.k is then not a function of i - j alone.

    Coefficients: one (H, M, N) pair of tables a^cos, a^sin per layer (the reference has one
    ``FourierEmbedding`` per block, separate for each head and for cos and sin), each drawn
    Xavier-normal with gain ``gain`` (0.3 in the reference's 60M configs, 0.4 at 180M, 0.6 at
    1.2B) plus a step identity (output d starts at input frequency d ceil(M/N); the plain
    identity when M = N), so at init each pair is RoPE's at frequency theta_{d ceil(M/N)} with
    small admixtures of the others. They are fixed, as the reference (``fourier_learnable``
    False) keeps them: buffers saved with the checkpoint; ``learnable: true`` trains them. The
    series are computed in fp32, as the reference's ``rope_full_precision``.

    ``cutoff_len``: L (default ``train.train_len``, the reference's ``max_sequence_length``).
    Not a rotary encoding for the RoPE scalings and Self-Extend/ReRoPE, which need frequencies
    of a pure rotation.
    """

    name = "fope"
    paper = "Hua et al. 2024, Fourier Position Embedding (FoPE)"
    description = "each rotary pair a Fourier series of rope's frequencies; those below 2 pi / train_len dropped"

    def __init__(self, dims: ModelDims, cutoff_len: int | None = None, gain: float = 0.3, learnable: bool = False,
                 base: float = 10000.0):
        super().__init__(dims)
        hs = dims.head_dim
        if hs % 2:
            raise PosbenchError(f"fope needs an even head dimension, got {hs}")
        if cutoff_len is not None and (int(cutoff_len) != cutoff_len or cutoff_len < 1):
            raise PosbenchError(f"fope cutoff_len must be a positive integer (null: train.train_len), got {cutoff_len}")
        if not gain >= 0:
            raise PosbenchError(f"fope gain must be >= 0, got {gain}")
        self.cutoff_len, self.gain, self.learnable, self.base = int(cutoff_len or dims.train_len), float(gain), \
            bool(learnable), float(base)
        freq = fope_frequencies(hs, self.base, self.cutoff_len)
        if freq.numel() == 0:
            raise PosbenchError(f"fope keeps the frequencies >= 2 pi / L; none is at L = {self.cutoff_len} "
                                "(the highest is 1): valid: cutoff_len >= 7")
        self.register_buffer("freq", freq, persistent=False)  # (M,)
        self.outputs = min(freq.numel(), hs // 4)  # N
        shape = (dims.n_layers, dims.n_heads, freq.numel(), self.outputs)
        cos_coef, sin_coef = torch.empty(shape), torch.empty(shape)
        eye = step_eye(freq.numel(), self.outputs)
        for layer in range(dims.n_layers):  # per block, as the reference's one FourierEmbedding a block
            for table in (cos_coef, sin_coef):
                nn.init.xavier_normal_(table[layer], gain=self.gain)
                table[layer] += eye
        if self.learnable:
            self.cos_coef, self.sin_coef = nn.Parameter(cos_coef), nn.Parameter(sin_coef)
        else:
            self.register_buffer("cos_coef", cos_coef)
            self.register_buffer("sin_coef", sin_coef)

    def series(self, positions: torch.Tensor, layer: int):
        """C, S (H, T, hs/2) at ``positions`` (T,) for ``layer``: the Fourier series on the first N
        pairs, ones on the rest."""
        with torch.autocast(positions.device.type, enabled=False):
            angles = positions.float()[:, None] * self.freq[None, :]  # (T, M)
            pad = self.dims.head_dim // 2 - self.outputs
            out = []
            for wave, coef in ((angles.cos(), self.cos_coef[layer]), (angles.sin(), self.sin_coef[layer])):
                series = torch.einsum("tm,hmn->htn", wave, coef.float())  # (H, T, N)
                out.append(nn.functional.pad(series, (0, pad), value=1.0))
        return out[0], out[1]

    def rotate(self, q, k, positions, layer):
        cos, sin = self.series(positions, layer)
        return apply_rotary(q, cos, sin, "half"), apply_rotary(k, cos, sin, "half")

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, cutoff_len={self.cutoff_len}, frequencies={self.freq.numel()}, "
                f"series_pairs={self.outputs}, learnable={self.learnable}")
