"""Self-Extend and ReRoPE: near keys at their trained positions, far keys (d >= W) regrouped."""

from __future__ import annotations

import torch

from ..errors import PosbenchError
from .base import Extension, Part, near_part


class Regrouped(Extension):
    """A method whose pairs at distance d >= W (``window``) take positions of its own (:meth:`positions`)."""

    kernel = "regroup"

    def validate(self) -> None:
        if not (self.window and self.window > 0):
            raise PosbenchError(f"eval.extension={self.method} needs eval.extension_window > 0 (the neighbour "
                                f"window W), got {self.window}; e.g. eval.extension_window=512")

    def identity_at(self, length: int) -> bool:
        return length <= self.window

    def parts(self, T: int, device=None) -> list[Part]:
        pos, W = torch.arange(T, device=device), self.window
        q_far, k_far = self.positions(pos, pos)
        return [near_part(pos, W), Part(q_far, k_far, lambda i, j: i - j >= W, lambda s, e: (0, max(0, e - W)))]


class SelfExtend(Regrouped, name="self_extend"):
    """**Self-Extend** (Jin et al. 2024, "LLM Maybe LongLM", datamllab/LongLM; neighbour window W,
    group size G): d < W: R(i)q . R(j)k as trained; d >= W: R(i // G + W - W // G)q . R(j // G)k,
    so far keys are seen at grouped distances that stay within what the model trained on."""

    paper = "Jin et al. 2024, LLM Maybe LongLM (Self-Extend); datamllab/LongLM"

    params = ("W", "G")

    def validate(self) -> None:
        super().validate()
        if not (self.group and self.group > 1):
            raise PosbenchError(f"eval.extension=self_extend needs eval.extension_group > 1 (the group size G), got "
                                f"{self.group}; e.g. eval.extension_group=8")

    def positions(self, i: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return i // self.group + self.window - self.window // self.group, j // self.group


class ReRoPE(Regrouped, name="rerope"):
    """**ReRoPE** (Su 2023, bojone/rerope; window W): d < W as trained; d >= W: R(W)q . k, the
    relative position clipped at W."""

    paper = "Su 2023, ReRoPE; bojone/rerope"

    params = ("W", None)

    def positions(self, i: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full_like(i, self.window), torch.zeros_like(j)


LEAK = 16  # Leaky ReRoPE's k: its reference's scaling_factor (bojone/rerope, leaky_rerope_patch.py)


class LeakyReRoPE(Regrouped, name="leaky_rerope"):
    """**Leaky ReRoPE** (Su 2023, "ReRoPE" and its leaky form, kexue.fm/archives/9708;
    bojone/rerope ``leaky_rerope_patch.py``; window W, leak k = ``group``): d < W as trained;
    d >= W: R(W + (i - W) / k)q . R(j / k)k, the relative position W + (d - W) / k, so distances
    past the window still grow, k times slower, instead of stopping at W as ReRoPE's. The
    reference rotates those queries at (i + W (k - 1)) / k with its linear-scaling embedding of
    factor k and the keys at j / k, the same positions. Its patch (like its ReRoPE patch) also
    multiplies every query by log-n, which is posbench's ``logn`` method and is left out here as
    for ``rerope``, so the two differ only in the far positions. Default k = 16 (the reference's
    ``scaling_factor``); W has none (the reference's 512 is for a 4,096-token model)."""

    paper = "Su 2023, Leaky ReRoPE (kexue.fm/archives/9708); bojone/rerope leaky_rerope_patch.py"

    params = ("W", "k")
    options = ("window", "leak")

    def validate(self) -> None:
        super().validate()
        if self.group is None:
            object.__setattr__(self, "group", LEAK)
        if not self.group > 1:
            raise PosbenchError(f"eval.extension=leaky_rerope needs a leak k > 1 (method.leak; k = 1 is the model "
                                f"as trained), got {self.group}")

    def positions(self, i: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.window + (i - self.window) / self.group, j / self.group
