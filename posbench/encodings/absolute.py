"""Absolute position encodings added to the token embeddings (``embed`` hook)."""

from __future__ import annotations

import torch
from torch import nn

from .base import ModelDims, PositionEncoding, PositionRangeError, register


def sinusoid_table(positions: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """Vaswani et al. 2017, eq. (3.5): PE(pos, 2i) = sin(pos / base^(2i/d)),
    PE(pos, 2i+1) = cos(pos / base^(2i/d)). positions: (T,) -> (T, dim)."""
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim)
    angles = positions.float()[:, None] * inv_freq[None, :]  # (T, dim/2)
    table = torch.stack((angles.sin(), angles.cos()), dim=-1)  # (T, dim/2, 2)
    return table.flatten(1)  # interleaved: sin at even, cos at odd dims


@register
class Sinusoidal(PositionEncoding):
    name = "sinusoidal"
    paper = "Vaswani et al. 2017, Attention Is All You Need"
    description = "fixed sin/cos absolute positions added to scaled token embeddings"
    scale_token_embedding = True

    def __init__(self, dims: ModelDims, base: float = 10000.0):
        super().__init__(dims)
        self.base = float(base)

    def embed(self, x, positions, tokens):
        return x + sinusoid_table(positions, self.dims.d_model, self.base).to(x.dtype)


@register
class Learned(PositionEncoding):
    name = "learned"
    paper = "Gehring et al. 2017; Radford et al. 2018 (GPT)"
    description = "trainable absolute position table; cannot go past its length"
    scale_token_embedding = True

    def __init__(self, dims: ModelDims, max_len: int | None = None):
        super().__init__(dims)
        self.max_len = int(max_len or dims.train_len)
        self.table = nn.Embedding(self.max_len, dims.d_model)
        nn.init.normal_(self.table.weight, std=0.02)

    def embed(self, x, positions, tokens):
        if int(positions.max()) >= self.max_len:
            raise PositionRangeError(
                f"learned position table has {self.max_len} entries, cannot encode position "
                f"{int(positions.max())} (learned absolute positions do not extrapolate)")
        return x + self.table(positions).to(x.dtype)
