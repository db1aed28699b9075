"""What a command prints, also kept in the run dir's log file.

Hydra's job logging gives every run a ``train.log``, but posbench speaks through stdout and
stderr (the run's header, progress, the evaluation's lines, the results table), not through
``logging``: without this, train.log held only what some library logged. :func:`tee_to` copies
everything written to stdout and stderr into that file as well, for as long as the command
runs, so a run dir keeps its own account, also for sweep jobs whose terminal output goes
elsewhere (a launcher's log, a Slurm file). Progress bars redraw with carriage returns in a
terminal only; off a terminal they print a line every 30 s, which the file keeps. The file keeps
of each line what a terminal shows last: the text after its last carriage return, so a bar
redrawn 400 times in a terminal is one line of train.log, its final state.
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
        self._line = ""  # the line not ended yet, as a terminal shows it now

    def write(self, text: str) -> int:
        *ended, self._line = (self._line + text).split("\n")
        for line in ended:
            self._file.write(shown(line) + "\n")
        self._line = shown(self._line, ended=False)
        return self._stream.write(text)

    def finish(self) -> None:
        """Write the unfinished line (a progress bar's last state) to the file."""
        if self._line:
            self._file.write(self._line + "\n")
            self._line = ""

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
            for tee in (sys.stdout, sys.stderr):
                if isinstance(tee, Tee):
                    tee.finish()
            sys.stdout, sys.stderr = out, err


def shown(line: str, ended: bool = True) -> str:
    """What a terminal shows of ``line`` (no newline in it): the text after its last carriage
    return; a line ended by CR LF keeps its text (``ended``: the newline followed it)."""
    if ended and line.endswith("\r"):
        line = line[:-1]
    return line.rsplit("\r", 1)[-1]
