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


@register
class Forgetting(PositionEncoding):
    name = "fox"
    paper = "Lin et al. 2025, Forgetting Transformer (FoX)"
    description = "a forget gate per head and token from the layer's input: logits gain sum of log f between key and query"
    reads_positions = False

    def __init__(self, dims: ModelDims, rope: bool = False, base: float = 10000.0, init_std: float = 0.02):
        super().__init__(dims)
        self.rope, self.base = bool(rope), float(base)
        self.reads_positions = self.rope  # RoPE's angles read the positions; the gates alone do not
        self.gates = nn.ModuleList(nn.Linear(dims.d_model, dims.n_heads) for _ in range(dims.n_layers))
        for gate in self.gates:
            nn.init.normal_(gate.weight, std=init_std)
            nn.init.zeros_(gate.bias)

    def decay(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """log f = logsigmoid(w^T x + b), (B, H, T), in fp32 (the reference's ``log_fgate``)."""
        return F.logsigmoid(self.gates[layer](x).float()).transpose(1, 2)

    def rotate(self, q, k, positions, layer):
        if not self.rope:
            return q, k
        angles = rope_angles(positions, self.dims.head_dim, self.base)
        cos, sin = angles.cos(), angles.sin()
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rope={self.rope}"


@register
class StickBreaking(PositionEncoding):
    """Stick-breaking attention (Tan, Shen, Yang, Courville & Panda, ICLR 2025, "Scaling
    Stick-Breaking Attention: An Efficient Implementation and In-depth Study"; reference code
    shawntan/stickbreaking-attention, ``stickbreaking_attention/sb_ref.py`` and its tests'
    ``ref_fwd``). Softmax is replaced by breaking a stick from the nearest key backwards: with
    beta_ij = sigmoid(z_ij) for the scaled logit z_ij = q_i . k_j / sqrt(head_dim),

        A_ij = beta_ij * prod_{j < t < i} (1 - beta_it)          (keys t < i; j < i)

    so a key gets what the nearer keys left, and nearer keys come first: an order, hence positions,
    with no position encoding at all. What the stick has left, 1 - sum_j A_ij, goes to the query's
    own value v_i (the reference's ``rem``). ``attend_current=True`` lets the query see its own key
    as the nearest (the reference's option; default False, as ``sb_attn``). Computed in log space,
    log A_ij = logsigmoid(z_ij) + sum_{j < t} logsigmoid(-z_it), the sum a cumulative sum taken from
    the nearest key, per query chunk (memory linear in T).
    """

    name = "stickbreaking"
    paper = "Tan et al. 2025, Scaling Stick-Breaking Attention"
    description = "attention weights break a stick from the nearest key back (sigmoid, not softmax); no positions"
    reads_positions = False

    def __init__(self, dims: ModelDims, attend_current: bool = False):
        super().__init__(dims)
        self.attend_current = bool(attend_current)

    def normalize(self, logits, q_pos, k_pos, hidden, layer):
        if not self.attend_current:
            hidden = hidden | (k_pos[None, :] == q_pos[:, None])
        log_beta = F.logsigmoid(-logits).masked_fill(hidden, 0.0)  # log (1 - beta), 0 off the stick
        # sum over visible t > j of log(1 - beta_it): a cumulative sum from the last key, shifted by one
        later = torch.flip(torch.cumsum(torch.flip(log_beta, [-1]), -1), [-1]) - log_beta
        return torch.exp(F.logsigmoid(logits) + later).masked_fill(hidden, 0.0)

    def pair_cost(self) -> int:
        return 4 * self.dims.n_heads  # logits, log(1 - beta), their cumulative sum, the weights

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, attend_current={self.attend_current}"


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
            from ..errors import PosbenchError
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
