"""Length-dependent logit scaling: the query times a factor that grows with the keys it sees.

Softmax over n keys flattens as n grows: with logits of bounded size the largest weight falls
like 1/n, so a model trained on short windows attends more diffusely on long ones ("attention
fading"). Multiplying the logits of a query that sees n keys by a factor growing like log n keeps
the distribution as sharp. Two schemes, one implementation, chosen by ``model.length_scaling``
for posbench's own models (any encoding) and by ``eval.extension=logn`` for pretrained ones:

* **logn** (Chiang & Cholak 2022, "Overcoming a Theoretical Limitation of Self-Attention";
  Qwen's ``use_logn_attn``, QwenLM/Qwen ``modeling_qwen.py``: ``logn_list = [math.log(i,
  seq_length) if i > seq_length else 1 ...]`` applied to the query): factor
  max(1, log n / log L), L the training length. Fixed, no parameters, 1 up to the training
  length, so training is unchanged and only longer contexts are rescaled.
* **ssmax**, Scalable-Softmax (Nakanishi 2025, arXiv 2501.19399, "Scalable-Softmax Is Superior
  for Attention"): softmax(s log(n) z) for logits z, i.e. the factor s_{l,h} log n with a
  learnable s per layer and head, used from the first training step. No reference code comes
  with the paper; s starts at ``model.ssmax_init`` (default 0.43, the default of the unofficial
  gdevos/Scalable-Softmax, which attributes it to the paper), is never weight-decayed, and the
  variant with a bias term (s log n + b, which the paper found to hurt length generalization) is
  not built.

n is the number of keys the query at index i sees under the causal mask, i + 1: the index, not the
position value, so randomized positions (``train.random_positions``) leave it unchanged, and in a
sliding window it counts the window's keys. Both scale q after the encoding's ``rotate``, so the
factor multiplies q.k and every content term an encoding's ``score`` hook computes from q, and not
an additive position bias (ALiBi's slopes keep their trained size, as in Qwen, whose logn scales
the query only). A scaled q goes through every attention kernel unchanged (SDPA, Toeplitz slices,
chunked content terms), so scaling costs one (T,) or (H, T) multiply per layer.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import LENGTH_SCALINGS
from ..errors import PosbenchError
from ..methods import logn_factor

SCALINGS = LENGTH_SCALINGS  # the choices live in the torch-free config, which checks them
SSMAX_INIT = 0.43


def key_counts(T: int, device=None) -> torch.Tensor:
    """(T,) float: the keys each of T causal queries sees, 1 .. T."""
    return torch.arange(1, T + 1, device=device, dtype=torch.float32)


class LengthScaling(nn.Module):
    """``model.length_scaling``: scales the query of every attention layer by the factor of
    ``kind`` (module docstring). Holds SSMax's s, (n_layers, n_heads), as ``s``."""

    def __init__(self, kind: str, n_layers: int, n_heads: int, train_len: int, ssmax_init: float = SSMAX_INIT):
        super().__init__()
        if kind not in SCALINGS[1:]:
            raise PosbenchError(f"model.length_scaling={kind!r} is not valid; valid choices: {', '.join(SCALINGS)}")
        self.kind, self.train_len = kind, train_len
        if kind == "logn":
            logn_factor(torch.ones(1), train_len)  # checks the base
        else:
            self.s = nn.Parameter(torch.full((n_layers, n_heads), float(ssmax_init)))

    def factor(self, counts: torch.Tensor, layer: int) -> torch.Tensor:
        """The factor on each query: (T,) for logn, (H, T) for ssmax, from key ``counts`` (T,)."""
        if self.kind == "logn":
            return logn_factor(counts, self.train_len)
        return self.s[layer][:, None] * torch.log(counts)[None, :]

    def forward(self, q: torch.Tensor, counts: torch.Tensor, layer: int) -> torch.Tensor:
        """q (B, H, T, hs) -> q times each query's factor."""
        f = self.factor(counts, layer)
        return q * f.to(q.dtype)[..., None]

    def extra_repr(self) -> str:
        return f"kind={self.kind}, train_len={self.train_len}"
