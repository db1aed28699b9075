"""User-facing errors: the CLI prints them as one line and exits non-zero."""

import errno
import sys


class PosbenchError(Exception):
    """Bad input or state that the user can fix; the message names the value and the choices."""


# "<job dir>: <error>" for each sweep job that failed in this `posbench -m ...` call. It lives
# here, not in the CLI module, because that module also runs as ``__main__`` (python -m).
SWEEP_FAILURES: list[str] = []


# A folder that cannot be written (read-only, not a folder, full): the user's to fix, not a bug
WRITE_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.ENOSPC, errno.EDQUOT)


def write_error(error: OSError) -> str | None:
    """The one line for an OSError of :data:`WRITE_ERRNOS` (None for any other, a bug's traceback)."""
    if error.errno not in WRITE_ERRNOS:
        return None
    where = f" {error.filename!r}" if error.filename else ""
    return (f"cannot write{where}: {error.strerror}; valid: a folder that can be written to, with free space; "
            "each file posbench writes is replaced whole or not at all, so what was there is unchanged")


def yaml_error(error: Exception) -> str | None:
    """The one line for a YAML file that does not parse (a run's config.yaml edited by hand, or
    torn), naming the file and line; None for any other error."""
    try:
        import yaml
    except ImportError:  # pragma: no cover - omegaconf needs it
        return None
    if not isinstance(error, yaml.YAMLError):
        return None
    mark = getattr(error, "problem_mark", None)
    where = f"{mark.name} line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "a YAML file"
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return (f"{where}: {problem} (not valid YAML); valid: the file as posbench wrote it (restore it from a copy, or "
            "train the run again)")


def fail(message: str, code: int = 2) -> None:
    """Print ``posbench: error: <message>`` on stderr and exit with ``code`` (the CLI's one-line
    error; Hydra callbacks use it too, so it lives below every stage)."""
    print(f"posbench: error: {message}", file=sys.stderr)
    raise SystemExit(code)
