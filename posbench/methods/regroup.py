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
