"""The rotation of q and k by angles: the one implementation that the rotary encodings
(:mod:`.rotary`, :mod:`.fourier`, :mod:`.forgetting`) and the training-free extensions
(:mod:`.extension`) share.

It is a module of its own, below the encoding classes, because :mod:`.base` imports
:mod:`.extension` (an encoding's extended attention) and :mod:`.rotary` imports :mod:`.base`:
the extensions could not import the rotation from :mod:`.rotary` without a cycle.
"""

from __future__ import annotations

import torch


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 pairing: str = "half") -> torch.Tensor:
    """Rotate each pair (x1, x2) by the angle of its frequency i: (x1 cos - x2 sin, x1 sin + x2 cos).
    ``half``: pair i is (x_i, x_{i+hs/2}); ``interleaved``: pair i is (x_{2i}, x_{2i+1}).
    x: (B, H, T, hs); cos, sin: (T, hs/2)."""
    if pairing == "half":
        x1, x2 = x.float().chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    else:
        pairs = x.float().unflatten(-1, (-1, 2))  # (B, H, T, hs/2, 2)
        x1, x2 = pairs[..., 0], pairs[..., 1]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.to(x.dtype)


def rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate the last dim of ``x`` (..., hs) by ``angles`` (..., hs/2, broadcast against x's
    leading dims), half-split pairs (x_k, x_{k+hs/2}), the convention of Llama and of posbench's
    ``pairing=half``: :func:`apply_rotary` on the angles' cos and sin."""
    return apply_rotary(x, angles.cos(), angles.sin())
