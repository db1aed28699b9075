"""Hydra callbacks: busy run dirs, and failures of sweep jobs run in other processes.

:class:`BusyRunDir`: a single ``posbench train`` whose run dir another process holds is refused
before Hydra writes its ``.hydra/`` files and job log there (the task then takes the run dir's
lock itself, :func:`posbench.runs.lock.hold`).

:class:`SweepFailures`: a failing sweep job writes ``FAILED`` (its error) in its job dir, or, refused because
another process holds its run dir, ``REFUSED.<job number>`` in the sweep's root, and the sweep goes on
(see ``posbench.cli.failures.user_errors``). With the basic launcher the jobs run in this process,
which counts them; with ``hydra/launcher=local_parallel`` or ``slurm`` they do not, so at
the end of the sweep this callback collects the ``FAILED`` and ``REFUSED`` files written during it and
the sweep exits 1 naming them, whatever the launcher.

:class:`NewRunDir`: the folders a single run's dir is about to create (``outputs/train/alibi/...``),
so that a run that fails before writing anything removes all of them, not only its own dir
(``posbench.cli.failures``).

:class:`SweepSummary`: a sweep ends with where its results are and the command that reads them
(``sweep dir: ...``, ``next: posbench report ...``); Hydra itself only says how many jobs it launched.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from ..errors import SWEEP_FAILURES, fail

REFUSED = "REFUSED"  # <sweep dir>/REFUSED.<job number>: a job refused because its run dir is another process's

# The folders that did not exist when this single run started, deepest first (the run dir, then
# those of its parents that Hydra creates with it): only these may be removed when it fails.
NEW_DIRS: list[Path] = []


class BusyRunDir(Callback):
    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        from hydra.core.hydra_config import HydraConfig

        from .lock import RunDirBusy, probe

        HydraConfig.instance().set_config(config)  # what run_job does first: resolves ${hydra:...}
        try:
            probe(Path(str(config.hydra.run.dir)), "train")
        except RunDirBusy as e:  # Hydra turns a callback's exception into a warning and goes on
            fail(str(e))


class SweepFailures(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.started = time.time()

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep = Path(str(config.hydra.sweep.dir))
        found = []  # (job dir, its error)
        for f in sorted(sweep.rglob("FAILED")) if sweep.is_dir() else []:
            if f.stat().st_mtime >= getattr(self, "started", 0.0):
                found.append((str(f.parent), (f.read_text(errors="replace").splitlines() or ["(no message)"])[0]))
        for f in sorted(sweep.glob(f"{REFUSED}.*")) if sweep.is_dir() else []:
            lines = f.read_text(errors="replace").splitlines()
            if f.stat().st_mtime >= getattr(self, "started", 0.0) and len(lines) >= 2:
                found.append((lines[0], lines[1]))
        for job_dir, message in found:
            if not any(line.startswith(f"{job_dir}:") for line in SWEEP_FAILURES):
                SWEEP_FAILURES.append(f"{job_dir}: {message}")


class NewRunDir(Callback):
    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        from hydra.core.hydra_config import HydraConfig

        HydraConfig.instance().set_config(config)  # what run_job does first: resolves ${hydra:...}
        run_dir = Path(str(config.hydra.run.dir)).absolute()
        NEW_DIRS[:] = [p for p in [run_dir, *run_dir.parents] if not p.exists()]


def _checkpoints(config: DictConfig) -> list[str]:
    """The run dirs an eval sweep evaluated: the values of its ``checkpoint=`` override."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for override in OverridesParser.create().parse_overrides(list(config.hydra.overrides.task)):
        if override.get_key_element() == "checkpoint":
            if not override.is_sweep_override():
                return [str(override.value())]
            return [str(getattr(v, "text", v)) for v in override.sweep_iterator()]  # a QuotedString: its text
    return [str(config.checkpoint)] if config.get("checkpoint") else []


class SweepSummary(Callback):
    """Train sweeps: their results are under the sweep dir. Eval sweeps merge their rows into the
    evaluated run dirs (results.csv, passkey.csv; the sweep dir holds Hydra's multirun.yaml and the
    ``FAILED`` files of failed jobs), so those are what to report."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep = str(config.hydra.sweep.dir)
        if config.hydra.job.name == "eval":
            runs = _checkpoints(config) or ["<run dir>"]
            print(f"sweep dir: {sweep} (failed jobs' FAILED files; the results were merged into the run dirs)")
            print("next: posbench report " + " ".join(map(shlex.quote, runs)), flush=True)
            return
        print(f"sweep dir: {sweep}")
        print(f"next: posbench report {shlex.quote(sweep)}", flush=True)
