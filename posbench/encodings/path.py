"""PaTH attention (``transition`` hook): data-dependent Householder transforms between positions.

Yang et al., "PaTH Attention: Position Encoding via Accumulating Householder Transformations",
NeurIPS 2025 (arXiv 2505.16381); reference code fla-org/flash-linear-attention,
``fla/layers/path_attn.py`` (``PaTHAttention``) and ``fla/ops/path_attn/naive.py``. Every token t
of a layer gives a Householder-like transform

    H_t = I - beta_t w_t w_t^T,    w_t = l2norm(silu(conv_3(W_up W_down x_t))),    beta_t = 2 sigmoid(W_b x_t + b),

per head (x the attention layer's input after its norm; conv_3 a causal depthwise convolution over
the last 3 tokens; beta in (0, 2) lets an eigenvalue turn negative), and the logit of query i and
key j < i is q_i^T H_i ... H_{j+1} k_j: the product of the transforms of the tokens between them
replaces RoPE's rotation by i - j, so "position" is what the content in between did. No position
value enters (``reads_positions`` is False); the kernel is :mod:`posbench.model.householder`.

As the reference's defaults (``use_low_rank_w=True``, ``use_w_shortconv=True``, ``conv_size=3``,
``use_forget_gate=False``): W_down d_model x 32 and W_up 32 x d_model without bias, the
convolution without bias, W_b with a bias; initialised as its ``_init_weights``, every weight ~
N(0, 0.02) and the bias 0, so each beta starts at 1. One set per layer. ``rank: 0`` takes one full
d_model x d_model projection (the reference's ``use_low_rank_w=False``); ``conv_size: 0`` drops the
convolution.

``path_fox`` is the paper's PaTH-FoX (the reference's ``use_forget_gate=True``): the same
transforms, and FoX's forget gate on top, log f_t = logsigmoid(W_g x_t + b_g) per head (``g_proj``,
d_model -> n_heads with a bias), the logit of query i and key j gaining sum_{t = j+1 .. i} log f_t
after the 1/sqrt(head_dim) scale, as ``parallel_path_attention`` adds its ``g_cumsum``. The gate is
:mod:`posbench.encodings.forgetting`'s, initialised as the reference's ``_init_weights`` does
(weights ~ N(0, 0.02), bias 0: every gate starts at 1/2); the Householder kernel sums the gates
beside the transforms (``decay`` and ``transition`` hooks together).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import PosbenchError
from .base import ModelDims, PositionEncoding, register
from .forgetting import forget_gates, log_forget


@register
class PaTH(PositionEncoding):
    name = "path"
    paper = "Yang et al. 2025, PaTH Attention (Householder transforms)"
    description = "a Householder transform per token from the layer's input: logit q_i^T H_i..H_{j+1} k_j"
    reads_positions = False

    def __init__(self, dims: ModelDims, rank: int = 32, conv_size: int = 3, init_std: float = 0.02):
        super().__init__(dims)
        if rank < 0 or conv_size < 0:
            raise PosbenchError(f"encoding path: rank={rank}, conv_size={conv_size}; valid: integers >= 0 "
                                "(rank 0: a full projection; conv_size 0: no convolution)")
        D, L = dims.d_model, dims.n_layers
        self.rank, self.conv_size = int(rank), int(conv_size)
        self.w_proj = nn.ModuleList(
            nn.Sequential(nn.Linear(D, rank, bias=False), nn.Linear(rank, D, bias=False)) if rank
            else nn.Linear(D, D, bias=False) for _ in range(L))
        self.w_conv = nn.ParameterList(nn.Parameter(torch.empty(D, 1, conv_size)) for _ in range(L if conv_size else 0))
        self.beta = nn.ModuleList(nn.Linear(D, dims.n_heads) for _ in range(L))
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=init_std)
            else:
                nn.init.zeros_(p)

    def transition(self, x: torch.Tensor, layer: int):
        """w: (B, H, T, hs) unit vectors in fp32, beta: (B, H, T) in (0, 2)."""
        B, T, D = x.shape
        w = self.w_proj[layer](x)
        if self.conv_size:  # causal: token t sees t - conv_size + 1 .. t
            kernel = self.w_conv[layer].to(w.dtype)
            w = F.silu(F.conv1d(F.pad(w.transpose(1, 2), (self.conv_size - 1, 0)), kernel, groups=D)).transpose(1, 2)
        w = F.normalize(w.float().view(B, T, self.dims.n_heads, -1).transpose(1, 2), dim=-1)
        beta = 2 * torch.sigmoid(self.beta[layer](x).float()).transpose(1, 2)
        return w, beta

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, conv_size={self.conv_size}"


@register
class PaTHFoX(PaTH):
    """PaTH-FoX (Yang et al. 2025; the reference's ``use_forget_gate=True``): PaTH's
    transforms and a FoX forget gate per head and token."""

    name = "path_fox"
    paper = "Yang et al. 2025, PaTH Attention (PaTH-FoX: with FoX's forget gate)"
    description = "path's Householder transforms plus FoX's forget gate: logits gain sum of log f between key and query"

    def __init__(self, dims: ModelDims, rank: int = 32, conv_size: int = 3, init_std: float = 0.02):
        super().__init__(dims, rank, conv_size, init_std)
        self.gates = forget_gates(dims, init_std)

    def decay(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """log f per head and token, (B, H, T), in fp32."""
        return log_forget(self.gates, x, layer)
