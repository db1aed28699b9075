"""One process per run directory: an OS lock on ``<run dir>/.posbench.lock``.

Two ``posbench train`` processes in one run dir would both write its checkpoint, metrics
and results. So ``posbench train`` holds an exclusive ``fcntl.flock`` on the lock file for
as long as it works in the run dir, and ``posbench eval`` a shared one: evaluations of one
run may overlap (their results.csv merges are serialised by :func:`posbench.eval.results.locked`),
but not with training it. A process that cannot get the lock refuses at once, naming the
holder from the lock file's contents (pid, host, start time), and touches nothing else.

Why flock: the kernel drops the lock when its holder dies, however it dies (SIGKILL, OOM
killer), so a lock file left behind by a killed run never blocks the re-run that resumes it;
no pid guessing is needed. Linux NFS clients map flock onto NFS byte-range locks, which the
server releases when a client's lease expires, so hosts sharing a file system exclude each
other too. Where the file system refuses locks (ENOLCK, EOPNOTSUPP), the lock file's contents
decide: a holder on this host and boot whose pid still runs the same process (same start
time in /proc) blocks; one from another boot of this host, or a dead pid, is stale and is
replaced; one on another host cannot be checked from here and blocks, with a message saying
to delete the file if that process is gone.

Under torchrun or Slurm tasks only rank 0 locks (the other ranks write nothing), so the ranks
of one job never refuse each other.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from ..errors import PosbenchError

LOCK_NAME = ".posbench.lock"
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class RunDirBusy(PosbenchError):
    """Another process works in this run dir; nothing of the run dir may be touched."""


def boot_id() -> str:
    """Changes at every boot of this host (Linux); '' elsewhere."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start(pid: int) -> str:
    """The start time of process ``pid`` in clock ticks since boot (Linux), '' if unknown:
    with the pid and the boot id it names one process, even after its pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[19]


def holder_info(command: str) -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "boot_id": boot_id(),
            "process_start": process_start(os.getpid()), "command": command,
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}


def read_info(path: Path) -> dict:
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def describe(info: dict) -> str:
    if not info:
        return "another process (it has not written its details yet)"
    return (f"posbench {info.get('command', '?')} (pid {info.get('pid', '?')} on host {info.get('host', '?')}, "
            f"started {info.get('started', '?')})")


def is_alive(info: dict) -> bool:
    """Whether the holder recorded in ``info`` may still run (only for file systems without locks)."""
    if not info:
        return False
    if info.get("host") != socket.gethostname():
        return True  # cannot be checked from here
    if info.get("boot_id") != boot_id():
        return False  # written before this host rebooted
    pid = int(info.get("pid", 0))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not info.get("process_start") or process_start(pid) in ("", info["process_start"])


def _flock(fd: int, shared: bool) -> bool | None:
    """True: locked; False: held by another process; None: this file system has no locks."""
    import fcntl

    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in NO_LOCKS:
            return None
        raise


def _open_locked(path: Path, shared: bool, command: str) -> tuple[int, bool]:
    """-> (fd of the lock file, whether it is flocked), or RunDirBusy. Retries when the file
    was replaced between open and flock (a holder removes it on release)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        locked = _flock(fd, shared)
        if locked is False:
            os.close(fd)
            raise RunDirBusy(_busy(path, read_info(path), command))
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd, bool(locked)
        os.close(fd)


def _locks_here() -> bool:
    """Whether this process takes run locks: rank 0 only (the other ranks write nothing), on
    systems with flock."""
    from .distributed import world

    return world().rank == 0 and sys.platform.startswith(("linux", "darwin", "freebsd"))


def _held_by_other(locked: bool | None, info: dict) -> bool:
    """The busy rule, one place for :func:`hold` and :func:`probe`: another process holds the
    flock (``locked`` False), or, on a file system without locks (None), the recorded holder is
    another process that is still alive."""
    return locked is False or (locked is None and bool(info) and info.get("pid") != os.getpid() and is_alive(info))


def _busy(path: Path, info: dict, command: str) -> str:
    other = ", or use another hydra.run.dir" if command == "train" else ""
    what = "study folder" if command == "study" else "run dir"  # posbench study holds its out folder
    return f"{what} {str(path.parent)!r} is in use by {describe(info)}; wait for it to finish{other}"


@contextmanager
def hold(run_dir: str | os.PathLike, command: str, shared: bool = False, log=None):
    """Hold the run dir's lock for the ``with`` block (exclusive; ``shared`` for evaluations).
    Raises :class:`RunDirBusy` naming the holder. Only rank 0 of a distributed job locks."""
    if not _locks_here():
        yield
        return
    log = log or (lambda message: print(message, file=sys.stderr))
    path = Path(run_dir) / LOCK_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    old = read_info(path)
    fd, locked = _open_locked(path, shared, command)
    try:
        if not locked and _held_by_other(None, old):  # no OS locks here: the recorded holder decides
            raise RunDirBusy(_busy(path, old, command) + f" (if it is gone, delete {str(path)!r})")
        if old and old.get("pid") != os.getpid() and not (shared and locked):
            log(f"posbench: {path} was left by {describe(old)}, which has ended; taking over the run dir")
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder_info(command)).encode(), 0)
        yield
    finally:
        _release(fd, path, shared and locked)


def probe(run_dir: str | os.PathLike, command: str) -> None:
    """Raise :class:`RunDirBusy` if another process holds ``run_dir``'s lock; create, write and
    keep nothing (the caller takes the lock with :func:`hold` when it starts its work). Lets a
    refused command stop before anything, Hydra's own files included, touches the run dir."""
    path = Path(run_dir) / LOCK_NAME
    if not _locks_here() or not path.is_file():
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # its holder just finished
        return
    try:
        locked = _flock(fd, shared=False)
        info = read_info(path)
        if _held_by_other(locked, info):
            raise RunDirBusy(_busy(path, info, command))
    finally:
        os.close(fd)  # drops the probe's own lock, if it took one


def _release(fd: int, path: Path, shared: bool) -> None:
    """Unlock; remove the lock file when no other process holds it, so a finished run leaves
    none. A shared holder removes it only if it can take the lock exclusively at once."""
    try:
        if not shared or _flock(fd, shared=False):
            path.unlink(missing_ok=True)
    finally:
        os.close(fd)
