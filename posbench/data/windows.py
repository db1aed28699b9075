"""Training batches of a language model: random windows of a corpus's token array."""

from __future__ import annotations

import numpy as np
import torch

from ..errors import PosbenchError
from .positions import draw_positions


class WindowSampler:
    """Random (B, T+1) windows from one token array, driven by its own generator; with
    ``random_positions`` = L also the batch's positions, a sorted random subset of [0, L)
    (Ruoss et al. 2023), else None (positions 0 .. T-1)."""

    def __init__(self, tokens: np.ndarray, train_len: int, batch_size: int, seed: int,
                 random_positions: int | None = None):
        if tokens.size <= train_len + 1:
            raise PosbenchError(f"train.train_len={train_len} needs more than {train_len + 1} train tokens; "
                                f"the corpus has {tokens.size}; valid: train.train_len <= {tokens.size - 2}")
        self.tokens = torch.from_numpy(tokens.astype(np.int64))
        self.offsets = torch.arange(train_len + 1)
        self.batch_size, self.random_positions = batch_size, random_positions
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        high = self.tokens.numel() - self.offsets.numel() + 1
        starts = torch.randint(0, high, (self.batch_size,), generator=self.generator)
        windows = self.tokens[starts[:, None] + self.offsets[None, :]]  # (B, T+1)
        positions = draw_positions(windows.shape[1] - 1, self.random_positions, self.generator)
        return windows[:, :-1], windows[:, 1:], positions
