"""User-facing errors: the CLI prints them as one line and exits non-zero."""


class PosbenchError(Exception):
    """Bad input or state that the user can fix; the message names the value and the choices."""
