"""Atomic checkpoint files and run-directory layout.

Every file is written to a hidden temp file beside it (``.last.pt.XXXX``), fsynced, then
renamed over the old one, so a process killed mid-write leaves the previous file intact
plus at most a stray temp file; nothing reads temp files, and training removes stray
checkpoint temps when it starts (:func:`remove_partial_writes`). A disk that fills up
mid-write is the same case: the temp file goes, the old file stays, the error is one line. Checkpoints load with
``weights_only=True``: a foreign pickle is refused, never unpickled (which could run code).
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import tempfile
from pathlib import Path

import torch

from ..errors import PosbenchError

FORMAT = "posbench-checkpoint-1"


class RunDir:
    """Files of one training run (one encoding, one seed)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.checkpoint = self.path / "checkpoints" / "last.pt"
        self.config = self.path / "config.yaml"
        self.metrics = self.path / "metrics.jsonl"
        self.results = self.path / "results.csv"
        self.plot = self.path / "ppl_vs_length.png"
        self.versions = self.path / "versions.json"

    def step_checkpoint(self, step: int) -> Path:
        """The checkpoint kept at ``step`` (``train.save_steps``), beside last.pt."""
        return self.checkpoint.parent / f"step_{step}.pt"

    def execution(self) -> str | None:
        """How the run's last training command ran its steps (``versions.json``'s ``execution``,
        :func:`posbench.train.loop.execution`); None for a run without it (a pretrained model's
        folder, runs trained before it was recorded)."""
        try:
            return json.loads(self.versions.read_text()).get("execution")
        except (OSError, ValueError):
            return None

    @classmethod
    def existing(cls, path: str | os.PathLike) -> "RunDir":
        """A finished or checkpointed posbench run, or a clear error."""
        p = Path(path).expanduser()
        if p.is_file() and p.suffix == ".pt":
            p = p.parent.parent
        run = cls(p)
        if not p.exists():
            raise PosbenchError(f"checkpoint={str(path)!r} does not exist; pass a posbench run directory")
        if not (run.config.is_file() and run.checkpoint.is_file()):
            raise PosbenchError(f"checkpoint={str(path)!r} is not a posbench run "
                                "(expected config.yaml and checkpoints/last.pt inside it)")
        return run


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(error: BaseException | None) -> OSError | None:
    """The ENOSPC/EDQUOT OSError behind ``error``, if any (torch.save wraps it in a RuntimeError)."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            return error
        error = error.__cause__ or error.__context__
    return None


def no_space(path: Path, error: OSError) -> PosbenchError:
    return PosbenchError(f"{error.strerror or 'no space left on device'} while writing {str(path)!r}; "
                         f"the previous {path.name} is unchanged; free space on that disk, then re-run the "
                         "same command (a training run resumes from its last checkpoint)")


def atomic_write(path: Path, write) -> None:
    """Call ``write(file)`` on a temp file in the same folder, fsync, then rename over ``path``.
    A full disk (ENOSPC, or a quota: EDQUOT) leaves ``path`` as it was and raises one line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are ordinary files
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        full = disk_full(e)
        if full is not None:
            raise no_space(path, full) from e
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


def save_checkpoint(path: Path, state: dict) -> None:
    atomic_write(path, lambda f: torch.save({"format": FORMAT, **state}, f))


def remove_partial_writes(path: Path) -> list[Path]:
    """Delete the temp files that writers of ``path`` killed mid-write left beside it.
    Only for files with one writer at a time (a run's checkpoint: one trainer per run dir)."""
    stray = sorted(path.parent.glob(f".{path.name}.*")) if path.parent.is_dir() else []
    for tmp in stray:
        tmp.unlink(missing_ok=True)
    return stray


def load_checkpoint(path: Path) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # weights_only refused a Python object: not ours
        raise PosbenchError(f"checkpoint {str(path)!r} is not a posbench checkpoint (it pickles Python objects; "
                            f"expected format {FORMAT!r})") from e
    except Exception as e:
        raise PosbenchError(f"checkpoint {str(path)!r} is truncated or not a torch file ({type(e).__name__}); "
                            "valid: a checkpoints/last.pt written by posbench train") from e
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise PosbenchError(f"checkpoint {str(path)!r} is not a posbench checkpoint (format {FORMAT!r})")
    return state
