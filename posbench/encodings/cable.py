"""Cable (``decay`` hook): context-aware additive biases, a learned bias per head and token.

Veisi & Mansourian 2025, "Context-aware Biases for Length Extrapolation" (Cable; arXiv
2503.08067); reference code axiomlab/Cable (``src/Cable.py``, ``CausalSelfAttention``). In the
spirit of ALiBi, whose bias falls by a fixed slope per token of distance, every token t sets
how much it costs to look past it, per head h, from the attention layer's input x_t (after its
norm):

    c_t = -softplus(w_h^T x_t + b_h) <= 0,    B_i = sum_{t <= i} c_t,
    logit(i, j) = q_i . k_j / sqrt(head_dim) + B_i - B_j = ... + sum_{t = j+1 .. i} c_t,

the reference's ``b = cumsum(-softplus(h_attn(x)))`` and ``Bias = b_i - b_j`` added to the scores
before softmax (``torch.baddbmm``). ALiBi is the case c_t = -m_h for every token. The ``decay``
hook returns c (B, H, T) and the attention kernel takes its cumulative sum and the differences
B_i - B_j (:func:`posbench.model.attention.cumulative_decay`), in fp32. No position value enters
(``reads_positions`` is False), as in the reference, whose model has no other position encoding.

Initialisation as the reference (nanoGPT's ``_init_weights`` on ``h_attn``, an
``nn.Linear(n_embd, n_head)`` in every layer): w ~ N(0, 0.02), b = 0, so every token starts
costing softplus(0) = ln 2 per step back. Its parameters, like every encoding's, get no weight
decay here (the reference decays ``h_attn.weight``, a 2-D parameter).

Two notes. The reference divides q and k by sqrt(C / n_embd), which is 1 (C is n_embd), so its
q . k is unscaled; here it is scaled by 1/sqrt(head_dim) as for every encoding, and
``encoding.scale_qk=false`` takes the reference's unscaled logits. And -softplus(z) =
log sigmoid(-z): Cable's c_t is FoX's log forget gate (:mod:`posbench.encodings.forgetting`) with
the projection's sign flipped, and both initialisations are symmetric in that sign, so the two
differ at the start in nothing but the scale of q . k; they are separate entries because they are
separate papers that compare against each other.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import ModelDims, PositionEncoding, register


@register
class Cable(PositionEncoding):
    name = "cable"
    paper = "Veisi & Mansourian 2025, Context-aware Biases for Length Extrapolation (Cable)"
    description = ("a bias per head and token from the layer's input: "
                   "logits gain -sum of softplus(w . x_t + b) between key and query")
    reads_positions = False

    def __init__(self, dims: ModelDims, init_std: float = 0.02, scale_qk: bool = True):
        super().__init__(dims)
        self.scale_qk = bool(scale_qk)
        self.biases = nn.ModuleList(nn.Linear(dims.d_model, dims.n_heads) for _ in range(dims.n_layers))
        for proj in self.biases:
            nn.init.normal_(proj.weight, std=init_std)
            nn.init.zeros_(proj.bias)

    def decay(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """c = -softplus(w^T x + b), (B, H, T), in fp32: the per-token terms of the reference's
        cumulative bias (its ``-F.softplus(self.h_attn(x))`` before the ``cumsum``)."""
        return -F.softplus(self.biases[layer](x).float()).transpose(1, 2)

    def logit_scale(self) -> float:
        """1/sqrt(head_dim), or 1 with ``scale_qk=False`` (the reference's unscaled q . k)."""
        return super().logit_scale() if self.scale_qk else 1.0

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scale_qk={self.scale_qk}"
