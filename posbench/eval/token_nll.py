"""``token_nll.npz``: the NLL of every scored token, per results row, beside a run's results.csv.

The report's bootstrap intervals (:mod:`posbench.intervals`) resample blocks of scored tokens,
so they need each token's loss, not only the row's mean. Every length of a ladder scores the
same tokens 1 .. n of the split in the same order (:mod:`posbench.eval.ladder`), so entry t of
every array of one run, and of every run scored on the same split with the same n, is the loss
of the same token: that is what makes the bootstrap paired.

One float32 array of n losses (nats, in target order) per results row, named by the row's key
without the run's own encoding, train_len and seed (:func:`token_key`). float32 keeps 7
significant digits of a loss of a few nats, far below any interval; n = 131,072 tokens cost
512 KiB per row. The file is a run artefact, rewritten atomically with results.csv.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from ..runs.rundir import atomic_write

FILE = "token_nll.npz"


def token_key(split: str, mode: str, stride, rope_scaling: str, eval_len) -> str:
    """'validation/nonoverlapping/stride=128/none/eval_len=128': one results row of a run."""
    return f"{split}/{mode}/stride={int(stride)}/{rope_scaling}/eval_len={int(eval_len)}"


def row_key(row) -> str:
    """:func:`token_key` of a results row (a mapping or a namedtuple with the KEY columns)."""
    get = row.get if hasattr(row, "get") else lambda k: getattr(row, k)
    return token_key(get("split"), get("mode"), get("stride"), get("rope_scaling"), get("eval_len"))


def read_token_nll(path: str | Path) -> dict[str, np.ndarray]:
    """Every array of a run's token_nll.npz (empty when there is none)."""
    path = Path(path)
    if not path.is_file():
        return {}
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def merge_token_nll(path: str | Path, new: dict[str, np.ndarray]) -> None:
    """Write ``new`` into the file at ``path``, replacing arrays of the same key, atomically.
    Call under the run directory's lock (:func:`posbench.eval.results.write_results` does)."""
    arrays = {**read_token_nll(path), **{k: np.asarray(v, dtype=np.float32) for k, v in new.items()}}
    buffer = io.BytesIO()
    np.savez(buffer, **dict(sorted(arrays.items())))
    atomic_write(Path(path), lambda f: f.write(buffer.getvalue()))
