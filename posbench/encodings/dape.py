"""DAPE (``bias`` + ``normalize`` hooks): an MLP over each pair's attention scores and static biases."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import PosbenchError
from .base import ModelDims, PositionEncoding, register

DAPE_BASES = ("alibi", "kerple_log", "kerple_power", "fire")


@register
class DAPE(PositionEncoding):
    """DAPE, data-adaptive positional encoding (Zheng et al., NeurIPS 2024, "DAPE: Data-Adaptive
    Positional Encoding for Length Extrapolation"; reference code chuanyang-Zheng/DAPE,
    ``DAPE.py``'s ``AliBi_DAPE``): a static bias B (ALiBi, KERPLE or FIRE: ``base``) plus an MLP
    over every (query, key) pair's attention scores and biases of all heads together,

        logits = X + B + f([X, B]),   f: Linear(2H, width) -> LeakyReLU -> Linear(width, H),

    X the scaled scores q.k / sqrt(head_dim), softmax over the result. One MLP per layer (the
    reference builds one with each attention layer), PyTorch's default Linear init as there,
    width 32 as there. The base encoding keeps its own parameters and initialisation. The MLP
    reads the scores, so DAPE runs the explicit attention path in query chunks.
    """

    name = "dape"
    paper = "Zheng et al. 2024, DAPE: Data-Adaptive Positional Encoding"
    description = "a static bias (alibi, kerple, fire) plus an MLP over each pair's scores and biases of all heads"

    def __init__(self, dims: ModelDims, base: str = "alibi", width: int = 32):
        super().__init__(dims)
        from . import build_encoding

        if base not in DAPE_BASES:
            raise PosbenchError(f"dape base {base!r} is not valid; valid choices: {', '.join(DAPE_BASES)}")
        self.base_name, self.width = base, int(width)
        self.base = build_encoding({"name": base}, dims)
        H = dims.n_heads
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(2 * H, self.width), nn.LeakyReLU(), nn.Linear(self.width, H))
                                  for _ in range(dims.n_layers))

    def bias(self, q_pos, k_pos, layer):
        return self.base.bias(q_pos, k_pos, layer)

    def normalize(self, logits, q_pos, k_pos, hidden, layer):
        """``logits`` hold X + B (the kernel added the bias): f([X, B]) is added, then softmax."""
        bias = self.bias(q_pos, k_pos, layer).float().expand_as(logits)  # (B, H, Tq, Tk)
        pairs = torch.cat((logits - bias, bias), dim=1).permute(0, 2, 3, 1)  # (B, Tq, Tk, 2H)
        adapted = logits + self.mlps[layer](pairs).permute(0, 3, 1, 2)
        return adapted.masked_fill(hidden, float("-inf")).softmax(-1)

    def pair_cost(self) -> int:
        # scores, bias, their pairs (2H), the MLP's hidden layer and output, the weights
        return 6 * self.dims.n_heads + self.width + self.base.pair_cost()

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, base={self.base_name}, width={self.width}"
