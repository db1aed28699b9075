"""Randomized positions, the sampler (Ruoss et al. 2023, "Randomized Positional Encodings Boost
Length Generalization of Transformers", ACL): T sorted distinct positions drawn from [0, L) for
one forward pass. What they mean for a model, and which encodings can use them, is in
:mod:`posbench.encodings.randomized`."""

from __future__ import annotations

import torch

from ..errors import PosbenchError


def random_positions(length: int, max_position: int, generator: torch.Generator,
                     device: torch.device | str | None = None) -> torch.Tensor:
    """A sorted random subset of [0, ``max_position``) of size ``length``, drawn without
    replacement with ``generator`` -> LongTensor (length,) on ``device``.

    Ruoss et al. 2023: positions for one forward pass (the whole batch), at training and at test
    time alike; ``max_position`` is L, at least the longest test length."""
    if not 0 < length <= max_position:
        raise PosbenchError(f"cannot draw {length} distinct positions from [0, {max_position}); "
                            f"valid: 1 <= length <= {max_position} (train.random_positions)")
    draw = torch.randperm(max_position, generator=generator, device=generator.device)[:length]
    return draw.sort().values.to(device or generator.device)


def draw_positions(length: int, max_position: int | None, generator: torch.Generator) -> torch.Tensor | None:
    """A batch's positions: None (0 .. length-1, nothing drawn from ``generator``) when
    ``max_position`` is None, else :func:`random_positions`."""
    if max_position is None:
        return None
    return random_positions(length, max_position, generator)
