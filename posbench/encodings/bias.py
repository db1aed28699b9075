"""Static additive attention biases (``bias`` hook): b(h, i, j) depends on positions only."""

from __future__ import annotations

import math

import torch
from torch import nn

from .base import ModelDims, PositionEncoding, register


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Press et al. 2022, sec. 3: geometric slopes starting at 2^(-8/n) with ratio 2^(-8/n).
    For n not a power of two, take the slopes of the closest smaller power of two, then
    every other slope of twice that many heads (the paper's interleaving rule)."""
    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = power_of_two(closest)
    if closest < n_heads:
        slopes += power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


@register
class ALiBi(PositionEncoding):
    name = "alibi"
    paper = "Press et al. 2022, Train Short, Test Long (ALiBi)"
    description = "linear distance penalty -m_h (i - j), fixed geometric slopes per head"

    def __init__(self, dims: ModelDims):
        super().__init__(dims)
        self.register_buffer("slopes", alibi_slopes(dims.n_heads), persistent=False)

    def bias(self, q_pos, k_pos, layer):
        distance = (q_pos[:, None] - k_pos[None, :]).float()  # (Tq, Tk), i - j
        return -self.slopes[:, None, None] * distance  # (H, Tq, Tk)


def t5_bucket(distance: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Raffel et al. 2020 (T5), unidirectional buckets of n = max(i - j, 0): exact below
    num_buckets/2, then log-spaced up to max_distance, beyond which all share the last."""
    n = distance.clamp(min=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    scaled = torch.log(n.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (scaled * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return torch.where(is_small, n, large)


@register
class T5Bias(PositionEncoding):
    name = "t5"
    paper = "Raffel et al. 2020, T5 relative position bias"
    description = "learned scalar per head for log-spaced distance buckets, shared by layers"

    def __init__(self, dims: ModelDims, num_buckets: int = 32, max_distance: int = 128):
        super().__init__(dims)
        self.num_buckets, self.max_distance = int(num_buckets), int(max_distance)
        self.table = nn.Embedding(self.num_buckets, dims.n_heads)
        nn.init.normal_(self.table.weight, std=0.02)

    def bias(self, q_pos, k_pos, layer):
        buckets = t5_bucket(q_pos[:, None] - k_pos[None, :], self.num_buckets, self.max_distance)
        return self.table(buckets).permute(2, 0, 1)  # (Tq, Tk, H) -> (H, Tq, Tk)
