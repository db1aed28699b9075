"""User-facing errors: the CLI prints them as one line and exits non-zero."""

import sys


class PosbenchError(Exception):
    """Bad input or state that the user can fix; the message names the value and the choices."""


# "<job dir>: <error>" for each sweep job that failed in this `posbench -m ...` call. It lives
# here, not in the CLI module, because that module also runs as ``__main__`` (python -m).
SWEEP_FAILURES: list[str] = []


def fail(message: str, code: int = 2) -> None:
    """Print ``posbench: error: <message>`` on stderr and exit with ``code`` (the CLI's one-line
    error; Hydra callbacks use it too, so it lives below every stage)."""
    print(f"posbench: error: {message}", file=sys.stderr)
    raise SystemExit(code)
