"""Stick-breaking attention (``normalize`` hook): weights from the nearest key back, not softmax."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import ModelDims, PositionEncoding, register


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
