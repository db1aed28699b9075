"""Training batches of a language model: windows of a corpus's token array.

``train.sampler`` picks how: ``random`` (:class:`WindowSampler`) draws each window's start
uniformly, so two windows may overlap or repeat; ``once`` (:class:`OnceSampler`) reads the
non-overlapping windows in a seeded permutation, each at most once a pass. Both keep the ids in
the array's own dtype (uint16 for a pypi corpus) and widen only the batch to int64.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from ..errors import PosbenchError
from .positions import draw_positions


def check_length(tokens: np.ndarray, train_len: int) -> None:
    if tokens.size <= train_len + 1:
        raise PosbenchError(f"train.train_len={train_len} needs more than {train_len + 1} train tokens; "
                            f"the corpus has {tokens.size}; valid: train.train_len <= {tokens.size - 2}")


class WindowSampler:
    """Random (B, T+1) windows from one token array, driven by its own generator; with
    ``random_positions`` = L also the batch's positions, a sorted random subset of [0, L)
    (Ruoss et al. 2023), else None (positions 0 .. T-1)."""

    def __init__(self, tokens: np.ndarray, train_len: int, batch_size: int, seed: int,
                 random_positions: int | None = None):
        check_length(tokens, train_len)
        self.tokens = tokens
        self.offsets = torch.arange(train_len + 1)
        self.batch_size, self.random_positions = batch_size, random_positions
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        high = self.tokens.size - self.offsets.numel() + 1
        starts = torch.randint(0, high, (self.batch_size,), generator=self.generator)
        index = (starts[:, None] + self.offsets[None, :]).numpy()
        windows = torch.from_numpy(self.tokens[index].astype(np.int64))  # (B, T+1)
        positions = draw_positions(windows.shape[1] - 1, self.random_positions, self.generator)
        return windows[:, :-1], windows[:, 1:], positions


class Cursor:
    """The state of :class:`OnceSampler`: how many batches it has drawn. It answers the trainer
    as a ``torch.Generator`` does (``get_state``/``set_state``, a tensor in the checkpoint), so a
    resumed run continues where the checkpoint left off."""

    def __init__(self):
        self.batches = 0

    def get_state(self) -> torch.Tensor:
        return torch.tensor([self.batches], dtype=torch.int64)

    def set_state(self, state: torch.Tensor) -> None:
        if state.dtype != torch.int64 or state.numel() != 1:
            raise PosbenchError("the checkpoint's sampler state is not that of train.sampler=once (a count of "
                                "batches); valid: resume with the train.sampler it was trained with")
        self.batches = int(state.item())


class OnceSampler:
    """(B, T+1) windows that never overlap: window i holds tokens [i T, i T + T + 1) (its last
    token, a target only, is the next window's first input, so every token is predicted at most
    once), for i < n = (tokens - 1) // T. Pass p reads them in ``randperm(n)`` drawn from a
    generator seeded by (seed, p); batch k takes places k B .. k B + B - 1 of the stream of passes.
    The batch is a function of (seed, k): the sampler's whole state is k (:class:`Cursor`).

    With ``steps``, a budget of more than one pass (steps x batch_size > n) is refused before
    training: a run under ``train.sampler=once`` reads no window twice. Random positions, if any,
    come from a generator seeded by (seed, k)."""

    def __init__(self, tokens: np.ndarray, train_len: int, batch_size: int, seed: int,
                 random_positions: int | None = None, steps: int | None = None):
        check_length(tokens, train_len)
        self.tokens, self.train_len, self.batch_size = tokens, train_len, batch_size
        self.seed, self.random_positions = seed, random_positions
        self.windows = (tokens.size - 1) // train_len
        if steps is not None and steps * batch_size > self.windows:
            raise PosbenchError(
                f"train.sampler=once: train.steps={steps} x train.batch_size={batch_size} = {steps * batch_size:,} "
                f"windows, but the training split has {self.windows:,} windows of {train_len} tokens "
                f"({tokens.size:,} tokens), one pass; valid: train.steps <= {self.windows // batch_size} at this "
                "batch size, or train.sampler=random (windows may repeat)")
        self.generator = Cursor()
        self._order: tuple[int, torch.Tensor] | None = None  # (pass, its permutation)

    def order(self, p: int) -> torch.Tensor:
        """The windows of pass ``p`` in the order it reads them."""
        if self._order is None or self._order[0] != p:
            generator = torch.Generator().manual_seed(mix(self.seed, p))
            self._order = (p, torch.randperm(self.windows, generator=generator))
        return self._order[1]

    def window_ids(self, k: int) -> torch.Tensor:
        """The windows of batch ``k``: places k B .. k B + B - 1 of the passes' concatenated orders."""
        places = torch.arange(k * self.batch_size, (k + 1) * self.batch_size)
        passes, within = places // self.windows, places % self.windows
        return torch.stack([self.order(int(p))[int(i)] for p, i in zip(passes, within)]) \
            if passes[0] != passes[-1] else self.order(int(passes[0]))[within]

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        k = self.generator.batches
        starts = self.window_ids(k) * self.train_len
        index = (starts[:, None] + torch.arange(self.train_len + 1)[None, :]).numpy()
        windows = torch.from_numpy(self.tokens[index].astype(np.int64))  # (B, T+1)
        positions = None
        if self.random_positions is not None:
            positions = draw_positions(self.train_len, self.random_positions,
                                       torch.Generator().manual_seed(mix(self.seed, k, salt=1)))
        self.generator.batches = k + 1
        return windows[:, :-1], windows[:, 1:], positions


def mix(seed: int, index: int, salt: int = 0) -> int:
    """A generator seed for (seed, index, salt): 63 bits of their SHA-256, so nearby pairs seed
    unrelated streams."""
    digest = hashlib.sha256(f"{seed}:{index}:{salt}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
