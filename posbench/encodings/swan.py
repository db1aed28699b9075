"""SWAN-GPT's layer layout: global NoPE layers interleaved with sliding-window RoPE layers.

Puvvada et al. 2025, "SWAN-GPT: An Efficient and Scalable Approach for Long-Context Language
Modeling" (arXiv 2504.08719; EMNLP 2025). No reference code is public. The architecture repeats
one unit of four layers: a global attention layer with no position encoding (NoPE) first, then
three sliding-window layers with RoPE (SWA-RoPE), each query seeing its last 512 keys:

    layer l:  NoPE, global            where l % 4 == 0
              RoPE, keys i - 512 < j <= i  otherwise

so a query at any length meets RoPE angles of at most 511 positions, and only the NoPE layers
reach past the window. This is ``rope_nope`` (:class:`~posbench.encodings.rotary.HybridRotary`)
with its NoPE layer moved from the last to the first place of each unit (Llama 4 and RNoPE-SWA
put it last) and the window on by default.

The paper also scales the NoPE layers' attention logits at inference by a factor that grows
logarithmically with the query's position, log(a + n) with a constant a fitted to perplexity at
32K tokens. That is not built here (the fitted constant is not given in any source this was
written from); it would fit the ``rotate`` hook, as q of the NoPE layers times s(n) for the n
keys each query sees, with s(n) = 1 up to ``train_len`` if the paper leaves training unscaled.
"""

from __future__ import annotations

from ..errors import PosbenchError
from .base import ModelDims, register
from .rotary import HybridRotary


@register
class Swan(HybridRotary):
    """SWAN-GPT (Puvvada et al. 2025): layer l is global NoPE where l % ``nope_every`` == 0 (the
    paper's 1:3, ``nope_every=4``) and RoPE with sliding-window attention over ``window`` keys
    (the paper's 512) otherwise. Self-Extend and ReRoPE regroup the positions of global
    attention, which the windowed RoPE layers do not have, so they are refused (as for
    ``rope_nope`` with a window); RoPE scalings at inference reach the RoPE layers."""

    name = "swan"
    paper = "Puvvada et al. 2025, SWAN-GPT (arXiv 2504.08719)"
    description = "global NoPE first in every 4 layers, the other 3 RoPE with a 512-key sliding window"
    regroupable = False  # every RoPE layer is windowed: nothing global for Self-Extend or ReRoPE to regroup

    def __init__(self, dims: ModelDims, nope_every: int = 4, window: int = 512, base: float = 10000.0,
                 pairing: str = "half"):
        if int(window) != window or window < 1:
            raise PosbenchError(f"swan window must be an integer >= 1 (its RoPE layers are windowed; window=0 "
                                f"is rope_nope's layout), got {window}")
        super().__init__(dims, nope_every, window, base, pairing)

    def is_nope(self, layer: int) -> bool:
        return layer % self.nope_every == 0
