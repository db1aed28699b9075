"""Inference-time methods: one class each, registered by its ``eval.extension`` name.

:class:`Extension` (``posbench/methods/base.py``) is the base and the method that changes
nothing; the built-ins register themselves when their module is imported here, and only here:
:mod:`.regroup` (Self-Extend, ReRoPE), :mod:`.scaled` (log-n, Llama 3's scaling), :mod:`.parts`
(STRING, attention sinks, LM-Infinite, Dual Chunk Attention). ``Extension("self_extend", 512, 8,
train_len)`` builds the class registered under that name; :func:`methods` lists them in order.
How any method's attention is computed: :mod:`posbench.encodings.extension`.
"""

from __future__ import annotations

from . import parts, regroup, scaled  # noqa: F401 - the built-ins register themselves
from .base import REGISTRY, Extension, Part, logn_factor
from .parts import STRING_FACTOR, STRING_LOCAL
from .scaled import LLAMA3_HIGH_FREQ_FACTOR, LLAMA3_LOW_FREQ_FACTOR, llama3_inv_freq

ORDER = ("none", "self_extend", "rerope", "logn", "llama3", "string", "sinks", "lm_infinite", "dca")


def methods() -> dict[str, type[Extension]]:
    """Name -> class of every registered method: the built-ins in their documented order, then others."""
    return {**{name: REGISTRY[name] for name in ORDER if name in REGISTRY}, **REGISTRY}


__all__ = ["Extension", "LLAMA3_HIGH_FREQ_FACTOR", "LLAMA3_LOW_FREQ_FACTOR", "Part", "STRING_FACTOR", "STRING_LOCAL",
           "llama3_inv_freq", "logn_factor", "methods"]
