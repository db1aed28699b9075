"""Shipped baselines: the runs of a shipped comparison, small enough to install, reportable beside
a researcher's own runs with paired intervals and without retraining them.

The report's paired intervals (:mod:`posbench.intervals`) resample the same blocks of scored
tokens in every run: what they need from a run is its results rows and, per row, the NLL sum and
token count of each of the ``BLOCKS`` blocks, not every token's loss. :func:`export_baseline`
writes exactly that for every run under some run or sweep dirs, one folder per run:

* ``results.csv``, the run's rows as they are;
* ``config.yaml``, the run's config (the report checks that a line's runs share it, and ``--by``
  reads it);
* ``blocks.npz``, per results row (named by :func:`posbench.eval.token_nll.row_key`) a (2,
  BLOCKS) array: the blocks' NLL sums and their token counts;
* where the run has them, ``positions.csv`` (the report's NLL-by-position figure) and
  ``learned_bias.npz`` (its learned bias by distance, :mod:`posbench.report.learned_bias`, which
  the report would otherwise rebuild from the checkpoint).

A few KiB per run instead of 0.5 MiB per row of ``token_nll.npz`` (up to 60 KiB more for a
per-layer learned bias). The bundles live in
``results/baselines/<study>/`` and ship inside the wheel as ``posbench/baselines/<study>/``, so
``posbench report MY_RUNS --baseline <study>`` works from a pip install; the report reads a
bundle's run folders as it reads run dirs (:func:`run_blocks`). The pairing holds only where
the user's runs scored the same tokens: the same data, split and ``eval.max_tokens`` (a cell
whose token count differs from its baseline's gets no paired interval, as between any runs).
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np

from ..config import shipped_dir
from ..errors import PosbenchError
from ..eval.results import RESULTS, find_files, read_table
from ..eval.token_nll import FILE as TOKEN_NLL
from ..eval.token_nll import read_token_nll, row_key
from ..intervals import block_sums
from ..runs.rundir import atomic_write
from .learned_bias import TABLE_FILE as BIAS_TABLE
from .learned_bias import run_bias, write_bias_table

BLOCKS_FILE = "blocks.npz"
POSITIONS = "positions.csv"


def baselines_dir() -> Path | None:
    """Where the shipped baselines are (inside the wheel, or results/baselines in a checkout)."""
    return shipped_dir("baselines")


def shipped_baselines() -> list[str]:
    """The names of the shipped baseline bundles."""
    root = baselines_dir()
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root else []


def resolve_baseline(name_or_path: str) -> Path:
    """A bundle's folder: a shipped bundle's name (``zoo_quick``) or a directory."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    root = baselines_dir()
    if root is not None and (root / name_or_path).is_dir():
        return root / name_or_path
    raise PosbenchError(f"report: --baseline {name_or_path!r} is neither a shipped baseline nor a directory; "
                        f"valid: {', '.join(shipped_baselines()) or '(none shipped)'} or a folder made by "
                        "posbench report --export-baseline")


def run_blocks(run: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Row key -> (block NLL sums, block token counts) of a run dir (from its token_nll.npz) or of
    a shipped run (its blocks.npz); empty where it has neither."""
    if (run / TOKEN_NLL).is_file():
        return {key: block_sums(nll) for key, nll in read_token_nll(run / TOKEN_NLL).items()}
    if (run / BLOCKS_FILE).is_file():
        with np.load(run / BLOCKS_FILE) as f:
            return {key: (f[key][0], f[key][1].astype(np.int64)) for key in f.files}
    return {}


def export_baseline(paths: list[str | Path], out: str | Path) -> list[Path]:
    """One folder per run under ``paths`` in ``out`` (``<encoding>/<run name>``), with what a
    paired report needs (module docstring). -> the folders written."""
    out = Path(out)
    written = []
    for results in find_files(paths, RESULTS):
        run = results.parent
        if not (run / "config.yaml").is_file() or not (run / TOKEN_NLL).is_file():
            raise PosbenchError(f"report: {run} has no config.yaml or {TOKEN_NLL}; valid: run dirs made by "
                                "posbench train (their per-token NLL is what the paired intervals need)")
        rows = read_table(results)
        blocks = run_blocks(run)
        keys = [row_key(r) for r in rows.to_dict("records") if r.get("status", "ok") == "ok"]
        missing = [k for k in keys if k not in blocks]
        if missing:
            raise PosbenchError(f"report: {run}'s {TOKEN_NLL} lacks the row {missing[0]}; re-run posbench eval on it")
        dest = out / str(rows.encoding.iloc[0]) / run.name
        if dest in written:
            raise PosbenchError(f"report: two runs export to {dest} ({run} and an earlier one); valid: export "
                                "each sweep to a folder of its own")
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(results, dest / RESULTS)
        shutil.copyfile(run / "config.yaml", dest / "config.yaml")
        if (run / POSITIONS).is_file():
            shutil.copyfile(run / POSITIONS, dest / POSITIONS)
        if (bias := run_bias(run)) is not None:
            write_bias_table(bias[1], dest / BIAS_TABLE)
        buffer = io.BytesIO()
        np.savez(buffer, **{k: np.stack([blocks[k][0], blocks[k][1].astype(np.float64)]) for k in sorted(keys)})
        atomic_write(dest / BLOCKS_FILE, lambda f: f.write(buffer.getvalue()))
        written.append(dest)
    if not written:
        raise PosbenchError(f"report: no results.csv under {', '.join(map(str, paths))}; valid: run or sweep dirs")
    return written
