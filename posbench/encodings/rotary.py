"""Rotary position embeddings (``rotate`` hook)."""

from __future__ import annotations

import torch

from ..errors import PosbenchError
from .base import ModelDims, PositionEncoding, register


def rope_angles(positions: torch.Tensor, head_dim: int, base: float) -> torch.Tensor:
    """theta_{p,i} = p * base^(-2i/hs) for i < hs/2 (Su et al. 2021, eq. 15). -> (T, hs/2)."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    return positions.float()[:, None] * inv_freq[None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+hs/2}) by the angle of frequency i ("rotate half" layout).
    x: (B, H, T, hs); cos, sin: (T, hs/2)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.to(x.dtype)


@register
class Rotary(PositionEncoding):
    name = "rope"
    paper = "Su et al. 2021, RoFormer"
    description = "rotates q and k by position-dependent angles; q.k depends on i - j only"

    def __init__(self, dims: ModelDims, base: float = 10000.0):
        super().__init__(dims)
        if dims.head_dim % 2:
            raise PosbenchError(f"rope needs an even head dimension, got {dims.head_dim}")
        self.base = float(base)
        self._cache: tuple | None = None  # (positions key, cos, sin), sized by the longest call

    def _cos_sin(self, positions: torch.Tensor):
        n = int(positions.max()) + 1
        if self._cache is None or self._cache[0] < n or self._cache[1].device != positions.device:
            size = max(n, 2 * self.dims.train_len)
            angles = rope_angles(torch.arange(size, device=positions.device), self.dims.head_dim, self.base)
            self._cache = (size, angles.cos(), angles.sin())
        _, cos, sin = self._cache
        return cos[positions], sin[positions]

    def rotate(self, q, k, positions, layer):
        cos, sin = self._cos_sin(positions)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
