"""The Forgetting Transformer (``decay`` hook): a data-dependent forget gate instead of positions.

Lin, Nikishin, He & Courville, "Forgetting Transformer: Softmax Attention with a Forget Gate",
ICLR 2025; reference code zhixuan-lin/forgetting-transformer
(``src/forgetting_transformer/model/forgetting_transformer/modeling_forgetting_transformer.py``,
``fgate_type="full"``, the paper's "FoX (LLaMA)" without its "Pro" extras). Each head has a
scalar forget gate per token,

    f_t = sigmoid(w^T x_t + b),    x_t the attention layer's input (after its norm),

and the logit of query i and key j <= i gains D_ij = sum_{t = j+1 .. i} log f_t = c_i - c_j with
c the cumulative sum of log f (after the 1/sqrt(head_dim) scale, unscaled, as the reference's
``forgetting_attention`` adds it). Attention then decays with distance at a rate the content
sets: a recency bias like ALiBi's, but chosen per token. No position enters (``reads_positions``
is False), unless ``rope=True`` adds RoPE as well (the paper's ablation).

Initialisation as the reference: w ~ N(0, 0.02) (its ``initializer_range``) and b = 0, so every
gate starts at sigmoid(0) = 1/2. One gate projection per layer. Its parameters, like every
encoding's, get no weight decay here (the reference decays its Linear weights).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import ModelDims, PositionEncoding, register
from .rotary import apply_rotary, rope_angles


def forget_gates(dims: ModelDims, init_std: float) -> nn.ModuleList:
    """One gate projection d_model -> n_heads per layer, as the reference initialises it:
    weights ~ N(0, init_std), biases 0 (every gate starts at sigmoid(0) = 1/2)."""
    gates = nn.ModuleList(nn.Linear(dims.d_model, dims.n_heads) for _ in range(dims.n_layers))
    for gate in gates:
        nn.init.normal_(gate.weight, std=init_std)
        nn.init.zeros_(gate.bias)
    return gates


def log_forget(gates: nn.ModuleList, x: torch.Tensor, layer: int) -> torch.Tensor:
    """log f = logsigmoid(w^T x + b), (B, H, T), in fp32 (the reference's ``log_fgate``)."""
    return F.logsigmoid(gates[layer](x).float()).transpose(1, 2)


@register
class Forgetting(PositionEncoding):
    name = "fox"
    paper = "Lin et al. 2025, Forgetting Transformer (FoX)"
    description = ("a forget gate per head and token from the layer's input: "
                   "logits gain sum of log f between key and query")
    reads_positions = False

    def __init__(self, dims: ModelDims, rope: bool = False, base: float = 10000.0, init_std: float = 0.02):
        super().__init__(dims)
        self.rope, self.base = bool(rope), float(base)
        self.reads_positions = self.rope  # RoPE's angles read the positions; the gates alone do not
        self.gates = forget_gates(dims, init_std)

    def decay(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """log f per head and token, (B, H, T), in fp32 (:func:`log_forget`)."""
        return log_forget(self.gates, x, layer)

    def rotate(self, q, k, positions, layer):
        if not self.rope:
            return q, k
        angles = rope_angles(positions, self.dims.head_dim, self.base)
        cos, sin = angles.cos(), angles.sin()
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rope={self.rope}"
