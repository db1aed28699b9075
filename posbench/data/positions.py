"""Position ids drawn for training, samplers of the data stage.

- Randomized positions (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length
  Generalization of Transformers", ACL): T sorted distinct positions drawn from [0, L) for one
  forward pass, at training and evaluation alike. What they mean for a model, and which encodings
  can use them, is in :mod:`posbench.encodings.randomized`.
- PoSE (Zhu et al. 2024, positional skip-wise training, :func:`pose_positions`): a training
  window's two chunks get position ids that skip ahead into a longer target length; evaluation
  then reads ordinary positions 0 .. T-1 (``train.pose_target``, :mod:`posbench.train.workload`).
"""

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


def pose_positions(length: int, target: int, generator: torch.Generator) -> torch.Tensor:
    """PoSE's position ids for one training window (Zhu et al. 2024, "PoSE: Efficient Context Window
    Extension of LLMs via Positional Skip-wise Training", ICLR) -> LongTensor (length,).

    The window is split into two chunks (the paper's N = 2) whose position ids skip ahead so that
    they reach into a ``target`` length the window itself does not have. As the reference draws
    them (dwzhu-pku/PoSE ``src/train_pose.py``, ``train_preprocess_function_pose``), with L =
    ``length`` and L_t = ``target``:

        l_0 ~ U{1, ..., floor((L + 1) / 2)}    the first chunk's length; the second's is L - l_0
        u_0 = 0,  u_1 ~ U{0, ..., L_t - L}     the skipping bias of each chunk
        ids = 0 .. l_0 - 1,  then  l_0 + u_1 .. L - 1 + u_1

    so ids increase strictly and the largest is L - 1 + u_1 <= L_t - 1. Both draws come from
    ``generator``, l_0 first (the reference's ``rt1``, then ``rt``). The reference also takes the
    second chunk's text from further into the document (its text skip v_1); here a window's tokens
    stay contiguous, the paper's v_i = 0 variant (its Table 4: little difference)."""
    if not 0 < length <= target:
        raise PosbenchError(f"train.pose_target={target} cannot hold a window of {length} tokens; "
                            f"valid: train.pose_target >= {length}")
    first = int(torch.randint(1, (length + 1) // 2 + 1, (1,), generator=generator))
    skip = int(torch.randint(0, target - length + 1, (1,), generator=generator))
    ids = torch.arange(length)
    ids[first:] += skip
    return ids
