"""What a failed command leaves behind and how it ends: the failure policy of every command.

A single run: a user error (:class:`posbench.errors.PosbenchError`) is one line and exit status
2, and the run dir Hydra made for it is removed with its new parents; a bug keeps its traceback.
A sweep job: any failure is written to the job dir's ``FAILED`` (a job refused because another
process holds its run dir: ``REFUSED.<job number>`` in the sweep's root) and counted in
:data:`posbench.errors.SWEEP_FAILURES`, and the sweep goes on, ending with status 1 under every
launcher (:class:`posbench.runs.callbacks.SweepFailures` reads the files of jobs run elsewhere). A closed
stdout (``posbench encodings | head``) ends the command quietly.
"""

from __future__ import annotations

import os
import shutil
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path

from ..errors import SWEEP_FAILURES, PosbenchError, fail, yaml_error
from ..runs.lock import RunDirBusy


def _remove_fresh_run_dir(run_dir: Path) -> None:
    """Undo what Hydra created for a job that failed before writing any checkpoint: the run dir,
    then the parents created with it (``outputs/train/alibi/``) while they are empty; rank 0's alone."""
    from ..runs.distributed import world

    if world().rank > 0 or (run_dir / "checkpoints").exists() or (run_dir / "results.csv").exists():
        return
    shutil.rmtree(run_dir / ".hydra", ignore_errors=True)
    for log in run_dir.glob("*.log"):
        log.unlink(missing_ok=True)
    try:
        run_dir.rmdir()
    except OSError:
        return
    _remove_new_parents(run_dir)


def _remove_new_parents(run_dir: Path) -> None:
    """The empty parents of a removed run dir that did not exist before the run started
    (:data:`posbench.runs.callbacks.NEW_DIRS`), below the working directory only, deepest first;
    the first one that is not empty (another run's files) stops the walk."""
    from ..runs.callbacks import NEW_DIRS

    cwd, new = Path.cwd().resolve(), {p.resolve() for p in NEW_DIRS}
    for parent in run_dir.resolve().parents:
        if parent not in new or parent == cwd or not parent.is_relative_to(cwd):
            return
        try:
            parent.rmdir()  # refuses a directory that is not empty
        except OSError:
            return


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _verbose() -> bool:
    """`hydra.verbose=true` (or a logger list) asks for tracebacks of user errors too."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.initialized() and bool(HydraConfig.get().verbose)


def _record_failure(job_dir: Path, message: str, details: str = "") -> None:
    """A multirun job failed: one line now, a line in the final summary, and ``FAILED`` in the
    job dir (the message, then any traceback) for ``posbench report``."""
    from ..runs.rundir import atomic_write_text

    SWEEP_FAILURES.append(f"{job_dir}: {message}")
    print(f"posbench: error in job {job_dir}: {message}", file=sys.stderr)
    atomic_write_text(job_dir / "FAILED", message + "\n" + (f"\n{details}" if details else ""))


def _record_refusal(sweep_dir: Path, num: int, job_dir: Path, message: str) -> None:
    """A multirun job refused because another process holds its run dir: ``REFUSED.<num>`` in the
    sweep's root (its job dir on the first line, the message on the second), which the sweep's
    end reads (:class:`posbench.runs.callbacks.SweepFailures`) where the job ran in another
    process (``hydra/launcher=local_parallel``, Slurm): the run dir itself is the other process's."""
    from ..runs.callbacks import REFUSED
    from ..runs.rundir import atomic_write_text

    sweep_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(sweep_dir / f"{REFUSED}.{num}", f"{job_dir}\n{message}\n")


@contextmanager
def user_errors(run_dir: Path | None):
    """A single run: PosbenchError -> one line, exit 2, its fresh run dir removed; a bug keeps
    its traceback. A multirun job: any exception, user error or bug (with its type), is
    recorded in the job dir's ``FAILED`` and the sweep goes on; it exits 1 at the end naming
    the failed jobs. Ctrl-C (SystemExit, KeyboardInterrupt) still stops the sweep, and ends a job
    that runs in a pool's worker process (``hydra/launcher=local_parallel``) with the worker: the
    signal went to the whole process group, the launcher is gone, and a worker left alive would
    idle on, or start a queued job, after the sweep was stopped."""
    try:
        yield
    except (SystemExit, KeyboardInterrupt) as e:
        import multiprocessing

        if multiprocessing.parent_process() is None or not _in_multirun():
            raise
        code = 130 if isinstance(e, KeyboardInterrupt) else e.code if isinstance(e.code, int) else 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # the job's own cleanup (checkpoint, run-dir lock) ran as the exception rose
    except Exception as e:
        if isinstance(e, BrokenPipeError):
            raise  # stdout closed (`| head`): main ends quietly, as SIGPIPE would; no job failed
        unparsed = yaml_error(e)
        if unparsed is not None:  # a run's config.yaml that does not parse: the user's to fix
            e = PosbenchError(unparsed)
        if not _in_multirun():
            if not isinstance(e, PosbenchError):
                raise  # bugs keep their traceback
            if run_dir is not None and not isinstance(e, RunDirBusy):  # a busy dir is another process's
                _remove_fresh_run_dir(run_dir)
            if _verbose():
                traceback.print_exc()
            fail(str(e))
        from hydra.core.hydra_config import HydraConfig

        job_dir = run_dir or Path(HydraConfig.get().runtime.output_dir)
        if isinstance(e, RunDirBusy):  # no FAILED in a dir another process works in: a record in the sweep's root
            SWEEP_FAILURES.append(f"{job_dir}: {e}")
            print(f"posbench: error in job {job_dir}: {e}", file=sys.stderr)
            _record_refusal(Path(HydraConfig.get().sweep.dir), HydraConfig.get().job.num, job_dir, str(e))
        elif isinstance(e, PosbenchError):
            _record_failure(job_dir, str(e))
        else:
            traceback.print_exc()
            first = (str(e).splitlines() or [""])[0]
            _record_failure(job_dir, f"{type(e).__name__}: {first}", traceback.format_exc())



@contextmanager
def quiet_broken_pipe():
    """``posbench encodings | head -3``: when the reader of stdout goes away, end quietly (Python's
    "Note on SIGPIPE": stdout onto devnull, so the flush at exit cannot fail again) with exit
    status 0, unless an error was on its way out already (its status, a bug's traceback)."""
    try:
        try:
            yield
        finally:
            sys.stdout.flush()  # a pipe's buffered output fails here, not at exit
    except BrokenPipeError as e:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if e.__context__ is not None and not isinstance(e.__context__, BrokenPipeError):
            raise e.__context__ from None
        raise SystemExit(0) from None
