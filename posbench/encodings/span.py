"""The first and last of a position tensor, known on the host without reading the device.

Several encodings size a table by the positions they are given: the rotation's cos/sin rows up
to the largest position, a bias evaluated once per distance up to the largest one, a learned
table checked against its length. Reading that size off a GPU tensor (``int(positions.max())``)
makes the host wait for every kernel queued before it, once a forward pass or once a layer, so
the CPU cannot run ahead queueing the next kernels: the steps of small models, which the CPU's
launches bound, wait on it most.

Positions are strictly increasing and shared by the batch (the contract of every attention
kernel, :func:`posbench.encodings.randomized.check_positions`), so the largest is the last, the
smallest the first, and a distance's extremes are differences of ends. Whoever makes positions
on the host notes their ends (:func:`note_span`): the model for its ``arange(T)``, and for
positions it is given, from the copy the sampler drew on the CPU. :func:`span` answers from the
note, or, for a slice of noted consecutive positions (a query chunk ``positions[s:e]``), from its
offset in the noted tensor; anything else is read from the device once and noted, so every layer
of a forward pass asks the device at most once. Inside ``torch.compile`` the ends are read as
before (a graph traces the values; a Python dictionary of tensors would break it).

Why a registry beside the tensor rather than an argument: the ends are needed deep inside
encodings' hooks (``rotate``, ``bias``, ``score``) whose signatures every plugin implements;
a note keyed weakly by the tensor reaches them without changing a signature, and dies with it.
"""

from __future__ import annotations

import weakref

import torch

# id(positions) -> (a weak reference to them, first, last); an entry goes when its tensor does. Not
# a WeakKeyDictionary: its lookups compare tensors with == where two keys' hashes meet, which a
# tensor answers element-wise.
_NOTED: dict[int, tuple[weakref.ref, int, int]] = {}


def _noted(positions: torch.Tensor) -> tuple[int, int] | None:
    entry = _NOTED.get(id(positions))
    return entry[1:] if entry is not None and entry[0]() is positions else None


def note_span(positions: torch.Tensor, first: int, last: int) -> torch.Tensor:
    """Record that strictly increasing ``positions`` run from ``first`` to ``last``; -> positions."""
    if not torch.compiler.is_compiling():
        key = id(positions)
        _NOTED[key] = (weakref.ref(positions, lambda ref: _NOTED.pop(key, None)
                                   if _NOTED.get(key, (None,))[0] is ref else None), int(first), int(last))
    return positions


def span(positions: torch.Tensor) -> tuple[int, int]:
    """(first, last) of strictly increasing 1-D ``positions``, as host integers: noted, derived
    from a noted consecutive tensor it is a slice of, or read once and noted."""
    if torch.compiler.is_compiling():
        return int(positions[0]), int(positions[-1])
    noted = _noted(positions)
    if noted is not None:
        return noted
    base = positions._base
    ends = _noted(base) if base is not None else None
    if ends is not None and positions.dim() == 1 and positions.stride() == (1,) and base.dim() == 1 \
            and base.stride() == (1,) and ends[1] - ends[0] == len(base) - 1 and len(positions):
        start = ends[0] + positions.storage_offset() - base.storage_offset()  # consecutive: i-th is first + i
        first, last = start, start + len(positions) - 1
    else:
        first, last = positions[[0, -1]].tolist()  # one read for both
    note_span(positions, first, last)
    return first, last


def distance_range(q_pos: torch.Tensor, k_pos: torch.Tensor) -> tuple[int, int]:
    """(smallest, largest) of i - j over queries at ``q_pos`` and keys at ``k_pos`` (both
    increasing): first query minus last key, last query minus first key. Inside ``torch.compile``
    one read of both (one graph break, as a single ``int(...)`` was before)."""
    if torch.compiler.is_compiling():
        lo, hi = torch.stack([q_pos[0] - k_pos[-1], q_pos[-1] - k_pos[0]]).tolist()
        return int(lo), int(hi)
    (q_first, q_last), (k_first, k_last) = span(q_pos), span(k_pos)
    return q_first - k_last, q_last - k_first
