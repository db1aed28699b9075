"""Positions counted from the context itself (``score`` hook)."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import PosbenchError
from .base import ModelDims, PositionEncoding, register


@register
class CoPE(PositionEncoding):
    """Golovneva et al. 2024, Contextual Position Encoding: Learning to Count What's Important.

    gate:           g_ij = sigmoid(q_i^T k_j)
    position:       p_ij = min(sum_{t=j..i} g_it, p_max)
    interpolation:  e[p] = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p]
    attention:      a_ij = softmax_j(q_i^T (k_j + e[p_ij]))

    As in the paper's code, the gate reads the scaled logit q_i^T k_j / sqrt(d_head), and
    q_i^T e[p] is interpolated as a scalar from z_i[n] = q_i^T e[n] for the integer
    positions n = 0..p_max (never a (Tq, Tk, hs) tensor). The CoPE term is added to
    q_i^T k_j before the kernel's 1/sqrt(d_head), i.e. e is added to the key as in the
    attention line. Gates of keys after the query are 0, so p_ij only counts t <= i; keys
    must come in increasing position order (the kernel's chunks do). One table per layer,
    shared by heads as in the paper's code.

    Init: the reference code (the paper's appendix ``CoPE`` module, ``pos_emb =
    nn.Parameter(torch.zeros(1, head_dim, npos_max))``, and x-transformers' port,
    lucidrains/x-transformers ``x_transformers/x_transformers.py`` ``CoPE``) starts the table
    at zeros and adds q.e[p] to the logits with no extra scale; this follows it by default
    (``init_std: 0``). The table still trains from the first step (its gradient is q times the
    attention gradient); the gates get theirs once e[n] differ. ``init_std > 0`` draws
    N(0, init_std) instead (0.02 was this project's former default).
    """

    name = "cope"
    paper = "Golovneva et al. 2024, Contextual Position Encoding (CoPE)"
    description = "position = sum of sigmoid gates q.k from key to query; interpolated learned embeddings"
    reads_positions = False  # positions only order the keys (the future mask); p_ij is counted

    def __init__(self, dims: ModelDims, max_pos: int = 64, init_std: float = 0.0):
        super().__init__(dims)
        self.max_pos = int(max_pos)
        if self.max_pos < 1:
            raise PosbenchError(f"cope max_pos must be >= 1, got {max_pos}")
        if float(init_std) < 0:
            raise PosbenchError(f"cope init_std must be >= 0, got {init_std}")
        self.init_std = float(init_std)
        # e[0..p_max]
        self.pos_emb = nn.Parameter(torch.randn(dims.n_layers, self.max_pos + 1, dims.head_dim) * self.init_std)

    def pair_cost(self) -> int:
        return 3 * self.dims.n_heads  # gates / positions, their floor (int64), the gathered terms

    def positions(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor,
                  k_pos: torch.Tensor) -> torch.Tensor:
        """Contextual positions p_ij: q (B, H, Tq, hs), k (B, H, Tk, hs) -> (B, H, Tq, Tk), fp32."""
        return self._reversed_positions(q, k, q_pos, k_pos).flip(-1)

    def _reversed_positions(self, q, k, q_pos, k_pos):
        """p with the key axis reversed (key Tk-1 first), so one cumsum sums from the query down."""
        gates = torch.sigmoid(((q * self.logit_scale()) @ k.flip(-2).transpose(-2, -1)).float())  # g_ij
        gates = gates.masked_fill(k_pos.flip(0)[None, :] > q_pos[:, None], 0.0)  # only t <= i count
        return gates.cumsum(-1).clamp(max=self.max_pos)  # sum_{t=j..i} g_it, at most p_max

    def score(self, q, k, q_pos, k_pos, layer):
        p = self._reversed_positions(q, k, q_pos, k_pos)  # (B, H, Tq, Tk), keys reversed
        z = (q @ self.pos_emb[layer].to(q.dtype).T).float()  # (B, H, Tq, p_max + 1): q_i^T e[n]
        dz = torch.cat((z[..., 1:] - z[..., :-1], torch.zeros_like(z[..., :1])), dim=-1)  # z[n+1] - z[n]
        floor = p.long()  # p >= 0, so truncation is floor p
        w = p - floor  # p - floor p; 0 when p is whole, where e[ceil p] = e[floor p]
        # (p - floor p) z[ceil p] + (1 - p + floor p) z[floor p] = z[floor p] + w (z[floor p + 1] - z[floor p])
        return torch.addcmul(z.gather(-1, floor), w, dz.gather(-1, floor)).flip(-1)  # q_i^T e[p_ij]
