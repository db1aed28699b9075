"""What a command prints, also kept in the run dir's log file.

Hydra's job logging gives every run a ``train.log``, but posbench speaks through stdout and
stderr (the run's header, progress, the evaluation's lines, the results table), not through
``logging``: without this, train.log held only what some library logged. :func:`tee_to` copies
everything written to stdout and stderr into that file as well, for as long as the command
runs, so a run dir keeps its own account, also for sweep jobs whose terminal output goes
elsewhere (a launcher's log, a Slurm file). Progress bars redraw with carriage returns in a
terminal only; off a terminal they print a line every 30 s, which the file keeps.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path


class Tee:
    """A text stream that writes to ``stream`` and appends to ``file``; everything else (isatty,
    encoding, fileno) is the stream's, so libraries that ask about the terminal see the real one."""

    def __init__(self, stream, file):
        self._stream, self._file = stream, file

    def write(self, text: str) -> int:
        self._file.write(text)
        return self._stream.write(text)

    def flush(self) -> None:
        self._file.flush()
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextmanager
def tee_to(path: str | Path):
    """Copy stdout and stderr into ``path`` (appended, line-buffered) inside the block."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", buffering=1, encoding="utf-8") as file:
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = Tee(out, file), Tee(err, file)
        try:
            yield
        finally:
            sys.stdout, sys.stderr = out, err
