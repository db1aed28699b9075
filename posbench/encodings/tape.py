"""TAPE: contextualized equivariant position features, updated layer by layer (``features`` hook).

Zhu et al. 2025, "Rethinking Addressing in Language Models via Contextualized Equivariant
Positional Encoding" (ICML 2025, arXiv 2501.00712); reference code VITA-Group/TAPE
(``models/llama/adape.py``, ``rpe_type: adape``), which this follows, learned from and written
anew.

Each token carries position features per head, e_t in C^{hs/2} (stored as (cos-part, sin-part),
F = hs real numbers), starting as RoPE's phases e_t,d = exp(i t theta_d), theta_d = base^(-2d/hs),
the same in every head. Layer l:

1. q and k of pair d = (x_d, x_{d+hs/2}) are multiplied, as complex numbers, by the layer's
   features: q'_d = q_d e_i,d, k'_d = k_d e_j,d; the logit Re(sum_d q'_d conj(k'_d)) / sqrt(hs)
   (at layer 0, RoPE);
2. the features are averaged with the attention weights of the values, a_i = sum_j A_ij e_j, and
   added back per head: e <- e + r_h a, with r_h = sum_g W_o[h, g] (the reference's
   ``einsum('bqnd,qe->bqnd', e, W)`` sums W's second index away, so its (H, H)
   ``post_attention_linear`` acts as these per-head factors; kept as the reference computes it);
3. after the block's MLP (output h_t), a gated mix over heads: e_t <- e_t + W_down (silu(W_x h_t)
   * (W_up e_t)), W_up (P, H), W_x (P, D), W_down (H, P), P channels (the reference's
   ``position_size``, 48 for its 12 heads: 4 per head).

Every update is a real-linear map of the features with weights from the content, the same on
every d: multiplying all e by one unit complex number per pair (a shift of every position, or any
rotation of the pair's plane) multiplies every update's output by it too (O(2)-equivariance),
and q'.k' is invariant to it. So only relative position reaches the logits, and the reference's
random start offset in training (positions k .. k + T - 1, k up to twice the training length)
changes no logit and is not drawn here. Keeping e as hs/2 complex numbers is the reference's
(cos, sin) tensors of width hs without their duplicated halves (``cat(freqs, freqs)``; every
update acts alike on both, so they stay equal).

Initialisation as the reference's: W_o, W_x, W_down ~ N(0, 0.02), W_up = 0, so at the start every
layer's features are RoPE's plus the small attention term, and the MLP term starts at zero (W_x
and W_down get their first gradient after W_up has moved). The last layer's update feeds no
attention, so it has no parameters here (the reference's are never trained).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import PosbenchError
from .base import ModelDims, PositionEncoding, register
from .rotary import rope_angles
from .rotation import apply_rotary

INIT_STD = 0.02  # the reference's initializer_range


class TapeUpdate(nn.Module):
    """One layer's feature update (steps 2 and 3 of the module docstring)."""

    def __init__(self, d_model: int, n_heads: int, channels: int):
        super().__init__()
        self.head_mix = nn.Parameter(torch.randn(n_heads, n_heads) * INIT_STD)  # W_o, (H, H)
        self.x_proj = nn.Parameter(torch.randn(channels, d_model) * INIT_STD)  # W_x, (P, D)
        self.up_proj = nn.Parameter(torch.zeros(channels, n_heads))  # W_up, (P, H): the reference zeroes it
        self.down_proj = nn.Parameter(torch.randn(n_heads, channels) * INIT_STD)  # W_down, (H, P)

    def forward(self, e, attended, h):
        e = e + attended * self.head_mix.sum(1)[None, :, None, None]  # e + r_h a, (B, H, T, F)
        gate = F.silu(h @ self.x_proj.t())  # (B, T, P)
        up = torch.einsum("bhtf,ph->bptf", e, self.up_proj.to(e.dtype)) * gate.transpose(1, 2)[..., None].to(e.dtype)
        return e + torch.einsum("bptf,hp->bhtf", up, self.down_proj.to(e.dtype))


@register
class Tape(PositionEncoding):
    """Zhu et al. 2025 (TAPE): RoPE phases per head and token, made contextual by every layer's
    attention and MLP with O(2)-equivariant updates (module docstring); ``channels`` P of the gated
    head mix (None: 4 per head, the reference's 48 for 12 heads); ``base`` of the initial phases."""

    name = "tape"
    paper = ("Zhu et al. 2025, Rethinking Addressing in Language Models via Contextualized Equivariant "
             "Positional Encoding (TAPE)")
    description = "RoPE phases per head and token, updated in every layer by its attention and MLP (equivariantly)"

    def __init__(self, dims: ModelDims, channels: int | None = None, base: float = 10000.0):
        super().__init__(dims)
        if dims.head_dim % 2:
            raise PosbenchError(f"tape needs an even head_dim (pairs of dims), got {dims.head_dim}")
        channels = 4 * dims.n_heads if channels is None else channels
        if int(channels) != channels or channels < 1:
            raise PosbenchError(f"tape channels must be an integer >= 1 (null: 4 per head), got {channels}")
        if not base > 0:
            raise PosbenchError(f"tape base must be > 0, got {base}")
        self.channels, self.base = int(channels), float(base)
        self.updates = nn.ModuleList(TapeUpdate(dims.d_model, dims.n_heads, self.channels)
                                     for _ in range(dims.n_layers - 1))

    def features(self, positions, batch):
        angles = rope_angles(positions, self.dims.head_dim, self.base)  # (T, hs/2)
        e = torch.cat((angles.cos(), angles.sin()), dim=-1)  # (T, hs): Re e | Im e
        return e.expand(batch, self.dims.n_heads, *e.shape)  # (B, H, T, hs), the same in every head

    def rotate_features(self, q, k, e, layer):
        cos, sin = e.float().chunk(2, dim=-1)  # (B, H, T, hs/2)
        return apply_rotary(q, cos, sin, "half"), apply_rotary(k, cos, sin, "half")

    def update_features(self, e, attended, h, layer):
        return self.updates[layer](e, attended, h)  # the model calls it for layers 0 .. n_layers - 2

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, channels={self.channels}, base={self.base}"
