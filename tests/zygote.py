"""A warm interpreter that runs each ``posbench`` command of the tests in a process of its own.

Most of a short command's time is its imports: torch, torch._dynamo (which the first optimizer
step imports), matplotlib, pandas, datasets and Hydra take about 4 of the 10 CPU seconds of
`posbench train experiment=smoke`, and the suite runs some 200 commands. This module is the
zygote of Android and of multiprocessing's forkserver: one process per test worker imports those
libraries once and never computes anything; each command is a ``fork()`` of it that runs
``posbench.cli.main(args)`` with its own stdin (/dev/null), stdout and stderr (files the caller
reads), environment, working directory and exit status, as ``python -m posbench.cli args`` would.
The command's own code, posbench's included, is imported and run in the fork, fresh each time.

What a fork cannot give is a fresh read of what libraries read at import time. So the caller
(``conftest.posbench``) runs a real subprocess instead when the command's environment differs
from the zygote's in a variable read at import (``PYTHON*``, ``OMP_*``, ``MKL_*``, ``KMP_*``,
``MPL*``, ``HF_*``, ``TORCH*``, ``CUDA*``), and the zygote refuses to start if its imports
printed anything, which a fresh process would print before the command's own output.
PYTHONPATH is the exception: each fork sets ``sys.path`` as ``python -m`` would from its own
working directory and PYTHONPATH (the zygote imports no posbench module and no plugin, and
plugins are looked up when a command runs), so plugin packages put on the path by a test work.

Protocol, one JSON line each way per command: {"args", "cwd", "env", "out", "err"} in; the
fork's pid, then its exit status (negative: the signal that ended it, as subprocess reports it)
out. The zygote ends when its stdin closes.
"""

import atexit
import importlib
import io
import json
import os
import signal
import sys
import threading

IMPORT_TIME = ("PYTHON", "OMP_", "MKL_", "KMP_", "MPL", "HF_", "TORCH", "CUDA")
STARTUP_PYTHONPATH = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
PRELOAD = ("torch", "torch._dynamo", "matplotlib", "matplotlib.pyplot", "pandas", "datasets", "hydra", "omegaconf",
           "tokenizers")


def import_time_env(env: dict) -> dict:
    """What of ``env`` libraries read at import (PYTHONPATH aside: each fork sets its own path)."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and k != "PYTHONPATH"}


def _child(request: dict) -> None:
    """In the fork: the command, with its own file descriptors, environment and directory."""
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdin = open(os.devnull)  # not the zygote's reader of requests, with what it buffered
    for fd, path in ((1, request["out"]), (2, request["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    os.environ.clear()
    os.environ.update(request["env"])
    if request["cwd"]:
        os.chdir(request["cwd"])
    # the path of `python -m`: the working directory, then PYTHONPATH's entries, then the rest
    added = [os.path.abspath(p) for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *added, *sys.path[1 + len(STARTUP_PYTHONPATH):]]
    importlib.invalidate_caches()  # files written since the zygote started are found
    sys.argv = [sys.executable, *request["args"]]
    code, interrupted = 0, False
    try:
        from posbench.cli import main

        main(request["args"])
    except SystemExit as e:  # as the interpreter reads it: None 0, an int itself, else printed and 1
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else _printed(e.code)
    except BaseException as e:
        sys.excepthook(type(e), e, e.__traceback__)
        code, interrupted = 1, isinstance(e, KeyboardInterrupt)
    _exit(code, interrupted)


def _printed(message) -> int:
    print(message, file=sys.stderr)
    return 1


def _exit(code: int, interrupted: bool) -> None:
    """End the fork as the interpreter ends: non-daemon threads joined (and what registers with
    threading's own exit hooks: concurrent.futures and loky executors shut down), atexit
    callbacks run (multiprocessing's children, logging's handlers), stdout and stderr flushed;
    then leave without tearing down the modules the zygote imported, which takes about 1.3 s
    of the fork's time with torch loaded and changes nothing the command wrote. An uncaught
    KeyboardInterrupt ends the process by SIGINT, as CPython does."""
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


def serve() -> None:
    captured = io.StringIO()
    real_out, real_err = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = captured
    try:
        for name in PRELOAD:
            __import__(name)
    finally:
        sys.stdout, sys.stderr = real_out, real_err
    if captured.getvalue():
        print(json.dumps({"refused": captured.getvalue()[:500]}), flush=True)
        return
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the fork ends as `python -m posbench.cli` ends (its exit status, threads, atexit)
            _child(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    serve()
