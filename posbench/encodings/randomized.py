"""Randomized positional encodings (Ruoss et al. 2023, "Randomized Positional Encodings Boost
Length Generalization of Transformers", ACL).

A model normally sees positions 0 .. T-1. With randomized positions, every forward pass draws
T distinct positions from [0, L), L at least the longest length the model will be evaluated on,
sorts them, and uses them instead; one draw serves the whole batch. This is done at training
*and* at test time, so a test window of any length up to L reads position values of the range
training covered, only spaced differently. The reference is deepmind/randomized_positional_encodings
``models/positional_encodings.py`` (``noisy_fixed_positional_encodings``), which samples
``sequence_length`` indexes of ``arange(max_time)`` without replacement and sorts them.

:func:`posbench.data.positions.random_positions` draws the positions (a sampler, in the data
stage); :meth:`posbench.model.transformer.LanguageModel.forward` takes them (``positions=``);
:func:`check_random_positions` says whether a run can use them at all.

Cost: with gaps, a relative bias past one query chunk is built per chunk and layer instead of
sliced from one Toeplitz matrix (:mod:`posbench.model.attention`), and the by-distance terms of
Transformer-XL and TENER span the largest distance in the chunk (up to L) rather than the
number of keys; results/bench/random_positions.md measures the first.
"""

from __future__ import annotations

import torch

from ..errors import PosbenchError
from . import REGISTRY, PositionEncoding


def check_positions(positions: torch.Tensor, length: int) -> None:
    """A PosbenchError unless ``positions`` are ``length`` strictly increasing integers >= 0,
    the contract of every attention kernel (a query sees the keys before it in the window)."""
    if positions.dim() != 1 or len(positions) != length or positions.is_floating_point():
        raise PosbenchError(f"positions must be an integer tensor of shape ({length},), got "
                            f"{positions.dtype} {tuple(positions.shape)}")
    if len(positions) and (int(positions[0]) < 0 or not bool((positions[1:] > positions[:-1]).all())):
        raise PosbenchError("positions must be strictly increasing and >= 0 (the window's tokens in order), "
                            f"got {positions[:8].tolist()}{' ...' if length > 8 else ''}")


def position_readers() -> list[str]:
    """Names of the registered encodings whose output depends on the position values."""
    return sorted(name for name, cls in REGISTRY.items() if cls.reads_positions)


def check_random_positions(encoding: str | type[PositionEncoding], max_position: int | None,
                           longest_len: int, rope_scaling: str = "none") -> None:
    """A one-line PosbenchError when ``train.random_positions`` = ``max_position`` cannot work:
    the encoding reads no positions (the setting would change nothing), a window of
    ``longest_len`` tokens cannot get distinct positions below it, or a RoPE scaling is asked
    (scalings stretch positions past the training window, and randomized positions already
    cover [0, L)). Nothing when ``max_position`` is None (positions 0 .. T-1)."""
    if max_position is None:
        return
    cls = REGISTRY.get(encoding) if isinstance(encoding, str) else encoding
    if cls is None:
        raise PosbenchError(f"unknown encoding {encoding!r}; valid choices: {', '.join(sorted(REGISTRY))}")
    setting = f"train.random_positions={max_position}"
    if not cls.reads_positions:
        raise PosbenchError(f"{setting} has no effect on encoding={cls.name}, which reads no positions; "
                            f"valid: encodings that read positions: {', '.join(position_readers())}")
    if longest_len > max_position:
        raise PosbenchError(f"{setting} cannot give a window of {longest_len} tokens distinct positions; "
                            f"valid: train.random_positions >= {longest_len} (the longest length), "
                            f"or lengths <= {max_position}")
    if rope_scaling != "none":
        raise PosbenchError(f"eval.rope_scaling={rope_scaling} does not combine with {setting} (its "
                            f"positions already cover [0, {max_position})); valid: eval.rope_scaling=none")
