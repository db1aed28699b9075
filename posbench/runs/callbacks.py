"""Hydra callbacks: busy run dirs, and failures of sweep jobs run in other processes.

:class:`BusyRunDir`: a single ``posbench train`` whose run dir another process holds is refused
before Hydra writes its ``.hydra/`` files and job log there (the task then takes the run dir's
lock itself, :func:`posbench.runs.lock.hold`).

:class:`SweepFailures`: a failing sweep job writes ``FAILED`` (its error) in its job dir and the sweep goes on
(see ``posbench.cli.user_errors``). With the basic launcher the jobs run in this process,
which counts them; with ``hydra/launcher=local_parallel`` or ``slurm`` they do not, so at
the end of the sweep this callback collects the ``FAILED`` files written during it and
the sweep exits 1 naming them, whatever the launcher.
"""

from __future__ import annotations

import time
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from ..errors import SWEEP_FAILURES, fail


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
        for f in sorted(sweep.rglob("FAILED")) if sweep.is_dir() else []:
            counted = any(line.startswith(f"{f.parent}:") for line in SWEEP_FAILURES)
            if f.stat().st_mtime >= getattr(self, "started", 0.0) and not counted:
                message = (f.read_text(errors="replace").splitlines() or ["(no message)"])[0]
                SWEEP_FAILURES.append(f"{f.parent}: {message}")
