"""Two encodings written the way a researcher would add their own to posbench.

``LogDistanceBias`` is declared as an entry point in pyproject.toml (``encoding=logdist``);
``ScaledSinusoidal`` is named by ``_target_`` in ``examples/config/encoding/scaled_sinusoidal.yaml``
(``--config-dir examples/config encoding=scaled_sinusoidal``). Both subclass posbench's public
``PositionEncoding`` and override only the hook they need.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from posbench.encodings import PositionEncoding


class LogDistanceBias(PositionEncoding):
    """b(h, i, j) = -s_h log(1 + (i - j)) for a key j <= i, with one learned slope s_h > 0 per
    head (s_h = softplus(w_h)), initialised on ALiBi's geometric sequence times ``init_scale``.

    The logarithm flattens the penalty for far keys, as KERPLE's log kernel does (Chi et al.
    2022, -r1 log(1 + r2 |i - j|)); with r2 = 1 this is that kernel with one parameter per head.
    The bias depends on i - j only and is the same in every layer, so the class says so
    (``relative_bias``, ``layer_invariant_bias``) and attention builds it once per forward pass;
    ``posbench check`` verifies both claims.
    """

    paper = "example plugin; cf. Chi et al. 2022 (KERPLE, log kernel)"
    description = "learned per-head slope times log(1 + distance)"
    relative_bias = True
    layer_invariant_bias = True

    def __init__(self, dims, init_scale: float = 1.0, learned: bool = True):
        super().__init__(dims)
        slopes = init_scale * torch.tensor([2.0 ** (-8.0 * (h + 1) / dims.n_heads) for h in range(dims.n_heads)])
        raw = torch.log(torch.expm1(slopes))  # softplus^-1, so softplus(raw) = slopes
        self.raw = nn.Parameter(raw, requires_grad=learned)

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, layer: int) -> torch.Tensor:
        distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0).float()  # (Tq, Tk); future keys are masked anyway
        return -nn.functional.softplus(self.raw)[:, None, None] * torch.log1p(distance)  # (H, Tq, Tk)


class ScaledSinusoidal(PositionEncoding):
    """Sinusoidal embeddings (Vaswani et al. 2017) times one learned scalar, initialised at
    1/sqrt(d_model) (Hua et al. 2022, "Transformer Quality in Linear Time", scaled sinusoidal).
    Added to the token embeddings before the first block (the ``embed`` hook)."""

    paper = "Hua et al. 2022 (scaled sinusoidal)"
    description = "sinusoidal embeddings times a learned scalar"

    def __init__(self, dims, base: float = 10000.0):
        super().__init__(dims)
        self.base = base
        self.scale = nn.Parameter(torch.tensor(dims.d_model ** -0.5))

    def embed(self, x: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        d = self.dims.d_model
        inv = torch.exp(-math.log(self.base) * torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
        angle = positions.to(torch.float32)[:, None] * inv[None, :]  # (T, D/2)
        table = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)  # (T, D): sin, cos interleaved
        return x + (self.scale * table).to(x.dtype)
