"""``posbench study NAME``: a study is data, a YAML file; this module trains what it lacks and reports.

That first line is ``posbench study --help``'s description (:func:`main` reads it). Here: the
command each sweep runs (``posbench -m train``, ``posbench -m eval``, ``posbench eval
pretrained=``), the scheduler that runs sweeps side by side (:func:`train`), the exports of
finished runs to ``runs``, and the report. The study file's format is the package's docstring."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..errors import PosbenchError
from ..report.keys import key_text
from .costs import _duration, _tokens, sweep_cost
from .derived import derived
from .planning import eval_extra, finished, orphaned, plan, pretrained_overrides, seed_major, unreported
from .spec import Study, Sweep, describe_study, load_study, parse_where, restrict, study_files, sweeps

HELP = ("train and evaluate the runs a study file names that are not done yet (by config hash and seed), "
        "export them, and report; a study is data: conf/study/NAME.yaml, or DIR/study/NAME.yaml with --config-dir DIR")


def _posbench() -> list[str]:
    return [sys.executable, "-m", "posbench.cli"]


def train_command(study: Study, sweep: Sweep, jobs: int, extra: list[str] = ()) -> list[str]:
    sweep_dir = study.out / sweep.folder
    dirs = [f"--config-dir={d}" for d in study.config_dirs]
    return [*_posbench(), "-m", "train", *dirs, *study.common, *sweep.overrides, *extra,
            "seed=" + ",".join(map(str, sweep.seeds)),
            "hydra/launcher=local_parallel", f"hydra.launcher.n_jobs={max(1, min(jobs, len(sweep.seeds)))}",
            f"hydra.sweep.dir={sweep_dir}", "hydra.sweep.subdir='seed=${seed}'"]


def eval_command(study: Study, sweep: Sweep, jobs: int, extra: list[str] = ()) -> list[str]:
    """``posbench -m eval`` on the sweep's runs (its parent's run dirs), ``jobs`` side by side."""
    runs = ",".join(f"'{study.out / sweep.folder}/seed={seed}'" for seed in sweep.seeds)
    dirs = [f"--config-dir={d}" for d in study.config_dirs]
    return [*_posbench(), "-m", "eval", *dirs, f"checkpoint={runs}", *sweep.overrides, *eval_extra(extra),
            "hydra/launcher=local_parallel", f"hydra.launcher.n_jobs={max(1, min(jobs, len(sweep.seeds)))}",
            f"hydra.sweep.dir={study.out / sweep.folder}/.eval/{sweep.stage}"]


def pretrained_command(study: Study, sweep: Sweep, jobs: int, extra: list[str] = ()) -> list[str]:
    """``posbench eval pretrained=<model> out=<out/folder> ...``: one command, the model once in memory."""
    dirs = [f"--config-dir={d}" for d in study.config_dirs]
    return [*_posbench(), "eval", *dirs, *pretrained_overrides(study, sweep, extra)]


def command(study: Study, sweep: Sweep, jobs: int, extra: list[str] = ()) -> list[str]:
    if sweep.pretrained:
        return pretrained_command(study, sweep, jobs, extra)
    return (eval_command if sweep.evaluates else train_command)(study, sweep, jobs, extra)


def log_path(study: Study, sweep: Sweep) -> Path:
    """A sweep's log: ``out/<folder>.log``; an eval or pretrained sweep's, beside its runs:
    ``out/<folder>/eval,<name>.log`` (a pretrained one's ``<stage>,<name>.log``)."""
    if sweep.pretrained:
        return study.out / sweep.folder / f"{sweep.stage},{sweep.name}.log"
    return study.out / sweep.folder / f"eval,{sweep.name}.log" if sweep.evaluates else study.out / f"{sweep.folder}.log"


EXPORT_EVERY = 60.0  # seconds between looks for finished runs in the sweeps still running


def export(study: Study, sweep: Sweep) -> list[Path]:
    """Export the finished runs of one sweep to ``runs/<folder>/seed=N``; -> those written. A
    training run's export is written once; an eval sweep's run is exported again where its
    results.csv holds rows its export lacks (:func:`_gained_rows`)."""
    from ..report.baselines import export_baseline

    if sweep.pretrained:
        return export_pretrained(study, sweep)
    written = []
    for run, dest in unexported(study, sweep):
        if (run / "tasks.csv").is_file():  # a task run: its rows and config are all the report reads
            written += _export_task(run, dest, study.runs / ".export")
            continue
        tmp = study.runs / ".export"
        _remove_tree(tmp)
        for path in export_baseline([run], tmp):
            _copy_probes(run, path)
            dest.parent.mkdir(parents=True, exist_ok=True)
            _remove_tree(dest)  # an export without its blocks (cut off), or one an evaluation added rows to
            path.rename(dest)
            written.append(dest)
        _remove_tree(tmp)
    return written


def unexported(study: Study, sweep: Sweep) -> list[tuple[Path, Path]]:
    """(run, its export) of each finished run of one sweep that its export lacks: a training
    run without an export (or one cut off without its blocks), an eval sweep's run whose
    results.csv or probe csv holds rows its export lacks (:func:`_gained_rows`), a pretrained
    folder whose files changed since its export (:func:`_pretrained_stale`). What :func:`export`
    writes, and what a study that ends names when an export is still missing."""
    if sweep.pretrained:
        run, dest = study.out / sweep.folder, study.runs / sweep.folder
        return [(run, dest)] if _pretrained_stale(run, dest) else []
    left = []
    for seed in sweep.seeds:
        run = study.out / sweep.folder / f"seed={seed}"
        dest = study.runs / sweep.folder / run.name
        if not finished(run):
            continue
        if (run / "tasks.csv").is_file():
            done = (dest / "tasks.csv").is_file()
        else:
            done = (dest / "blocks.npz").is_file() and not (sweep.evaluates and _gained_rows(run, dest))
        left += [] if done else [(run, dest)]
    return left


def _pretrained_stale(run: Path, dest: Path) -> bool:
    """Whether a pretrained folder holds rows (a csv or json) newer than its export."""
    files = [p for p in run.glob("*") if p.suffix in (".csv", ".json")] if run.is_dir() else []
    return bool(files) and not (dest.is_dir() and max(p.stat().st_mtime for p in files) <= dest.stat().st_mtime)


def export_pretrained(study: Study, sweep: Sweep) -> list[Path]:
    """A pretrained folder exported to ``runs/<folder>`` where its files changed since: results.csv,
    positions.csv and config.yaml with the per-block sums the report's intervals need (as a
    trained run's, :func:`posbench.report.baselines.export_baseline`), and every probe's csv with
    probes.json (:func:`_copy_probes`). -> [the export] when written. A folder that holds no rows
    yet (an evaluation that has written only its config.yaml) is not exported: its config alone
    would replace the export's."""
    import shutil

    from ..report.baselines import export_baseline

    run, dest, tmp = study.out / sweep.folder, study.runs / sweep.folder, study.runs / ".export"
    if not _pretrained_stale(run, dest):
        return []
    _remove_tree(tmp)
    if (run / "results.csv").is_file():
        made = export_baseline([run], tmp)[0]
    else:  # probes alone
        made = tmp / "probes"
        made.mkdir(parents=True)
        shutil.copyfile(run / "config.yaml", made / "config.yaml")
    _copy_probes(run, made)
    if dest.is_dir():
        _keep_exported(dest, made)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_tree(dest)
    made.rename(dest)
    _remove_tree(tmp)
    return [dest]


def _keep_exported(old: Path, new: Path) -> None:
    """Keep in a new export ``new`` the rows of the export ``old`` that the new one lacks: a folder
    under ``out`` made again (a fresh machine) holds only what was computed since, and the export
    is where the earlier rows live. Each csv is merged by its key (the new rows win), the
    per-block sums of the kept result rows go with them, and probes.json keeps the entry of every
    probe whose csv is kept (the new entries win)."""
    import json

    import numpy as np

    from ..eval.results import KEY, merge_csv, read_table
    from ..eval.token_nll import row_key
    from ..report.baselines import BLOCKS_FILE

    for path in old.glob("*.csv"):
        mine = read_table(path)
        theirs = read_table(new / path.name) if (new / path.name).is_file() else mine.iloc[:0]
        key = [c for c in mine.columns if c in KEY or c in ("depth", "bin_start", "length")]
        merged = merge_csv(new / path.name, theirs, key, old=mine)
        if path.name == "results.csv" and (old / BLOCKS_FILE).is_file():
            blocks = dict(np.load(old / BLOCKS_FILE))
            if (new / BLOCKS_FILE).is_file():
                blocks.update(dict(np.load(new / BLOCKS_FILE)))
            keys = {row_key(r) for r in merged.to_dict("records")}
            np.savez(new / BLOCKS_FILE, **{k: v for k, v in sorted(blocks.items()) if k in keys})
    if (old / "probes.json").is_file():
        theirs = json.loads((new / "probes.json").read_text()) if (new / "probes.json").is_file() else {}
        merged = {**json.loads((old / "probes.json").read_text()), **theirs}
        (new / "probes.json").write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")


def _export_task(run: Path, dest: Path, tmp: Path) -> list[Path]:
    """An algorithmic task's run exported once: its tasks.csv and config.yaml (no per-token NLL)."""
    import shutil

    _remove_tree(tmp)
    tmp.mkdir(parents=True)
    for name in ("config.yaml", "tasks.csv"):
        shutil.copyfile(run / name, tmp / name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_tree(dest)
    tmp.rename(dest)
    return [dest]


def _copy_probes(run: Path, dest: Path) -> None:
    """Every probe's csv of a run dir, and probes.json, into its export."""
    import shutil

    from ..eval.probes import probe_files

    for name in probe_files(run):
        shutil.copyfile(run / f"{name}.csv", dest / f"{name}.csv")
    if (run / "probes.json").is_file():
        shutil.copyfile(run / "probes.json", dest / "probes.json")


def _gained_rows(run: Path, dest: Path) -> bool:
    """Whether the run's results.csv holds a row (by its key and config hash) its export's lacks,
    or a probe's csv holds rows its export's does not."""
    from ..eval.probes import probe_files
    from ..eval.results import read_table

    for name in probe_files(run):
        theirs = dest / f"{name}.csv"
        if not theirs.is_file() or len(read_table(theirs)) < len(read_table(run / f"{name}.csv")):
            return True
    from ..eval.token_nll import row_key

    def keys(path: Path) -> set:
        if not path.is_file():
            return set()
        return {(row_key(r), str(r["config_hash"])) for r in read_table(path).to_dict("records")}

    return bool(keys(run / "results.csv") - keys(dest / "results.csv"))


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _pending(sweep: Sweep, waiting: list[Sweep], running: list) -> bool:
    """Whether the sweep its runs start from is still to train or training, or (an eval sweep) an
    earlier sweep on the same run dirs is still waiting or running (``posbench eval`` holds a run dir)."""
    ahead = waiting[:waiting.index(sweep)] if sweep in waiting else waiting
    if sweep.pretrained:  # one posbench eval at a time writes a pretrained folder (and holds the model)
        return any(w.folder == sweep.folder for w in ahead + [r[0] for r in running])
    return bool(sweep.parent) and any(w.folder == sweep.parent for w in ahead + [r[0] for r in running])


STOP_GRACE = 120.0  # seconds a signalled sweep has to save its checkpoints before its processes are killed


class Stop:
    """When the study stops early: at its ``--deadline`` (seconds from the start), or at SIGINT or
    SIGTERM (Ctrl-C, ``timeout``, a cluster's or a GPU slot's end). Each sweep runs in a process
    group of its own (a terminal's Ctrl-C reaches the study alone), so a stop reaches every run
    once: the study starts nothing more and sends SIGTERM to each running sweep's group, whose runs
    save a checkpoint after their current step and exit (posbench.train.loop); what finished is
    exported, and the same command resumes the rest. A second signal kills the sweeps at once."""

    def __init__(self, deadline: float | None = None):
        self.end = None if deadline is None else time.monotonic() + deadline
        self.deadline, self.reason, self.signalled_at = deadline, None, None
        self.running: list = []  # the scheduler's (sweep, process, log) of the sweeps running now

    def due(self) -> bool:
        if self.reason is None and self.end is not None and time.monotonic() >= self.end:
            self.reason = f"its --deadline of {self.deadline:g} s passed"
        return self.reason is not None

    def handler(self, signum, frame):
        if self.reason is not None and self.signalled_at is not None:
            self.kill()
            raise KeyboardInterrupt
        self.reason = f"it got {signal.Signals(signum).name}"

    def signal_all(self) -> None:
        """SIGTERM to every running sweep's process group, once."""
        self.signalled_at = time.monotonic()
        self._send(signal.SIGTERM)

    def kill(self) -> None:
        self._send(signal.SIGKILL)

    def _send(self, sig) -> None:
        for _, proc, _ in self.running:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except (ProcessLookupError, PermissionError):  # the group has just ended
                    pass


def _install(stop: Stop) -> dict:
    """The study's SIGINT and SIGTERM handlers (main thread only) -> the previous ones."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, stop.handler) for sig in (signal.SIGINT, signal.SIGTERM)}


def train(study: Study, todo: list[Sweep], jobs: int, extra: list[str] = (), stop: Stop | None = None) -> list[str]:
    """Run the sweeps side by side, at most ``jobs`` runs at once; export each run within
    ``EXPORT_EVERY`` seconds of its end (a sweep whose seeds run one after another keeps its
    first seed's run even when the study is cut off before the last), and each sweep as it ends
    (its line counts the runs exported while it ran too, then how many of the command's runs are
    done and, while some are left, how long they take at the pace of those done: runs side by
    side included, so an estimate of a long study's end, not of one run).
    Of the sweeps ready to start, those whose parent has trained go first (stable otherwise): with
    fewer jobs than sweeps, a line's branches finish it before the next line's run starts, so a
    study cut off early holds whole lines. ``stop``: see :class:`Stop`; once it is due no sweep
    starts, and those stopped are not failed ones. -> the sweeps that failed (their logs' paths)."""
    stop = stop or Stop()
    previous = _install(stop)
    try:
        return _schedule(study, todo, jobs, extra, stop)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _schedule(study: Study, todo: list[Sweep], jobs: int, extra, stop: Stop) -> list[str]:
    waiting, running, failed, dead = list(todo), [], [], set()
    exported: dict[int, set[Path]] = {}  # by sweep process: the runs exported while it ran
    total, began = sum(len(s.seeds) for s in todo), time.monotonic()  # the tally each sweep's line ends with
    ended = settled = 0  # runs done; runs done, failed or never to start
    stop.running = running
    last_export = time.monotonic()
    while waiting or running:
        if stop.due():
            waiting.clear()
            if stop.signalled_at is None:
                print(f"study {study.name}: stopping because {stop.reason}: nothing new starts; {len(running)} "
                      f"sweep(s) save a checkpoint and stop (a second signal kills them)", file=sys.stderr, flush=True)
                stop.signal_all()
            elif time.monotonic() - stop.signalled_at > STOP_GRACE:
                stop.kill()
        busy = sum(min(jobs, len(s.seeds)) for s, _, _ in running)
        for sweep in [w for w in waiting if w.parent in dead]:
            waiting.remove(sweep)  # its parent failed: nothing to start from
            settled += len(sweep.seeds)
            dead.add(sweep.folder)
            failed.append(f"{log_path(study, sweep)} (not started: {sweep.parent} failed)")
        ready = [w for w in waiting if not _pending(w, waiting, running)]
        ready.sort(key=lambda w: not w.parent)  # a line's branches before the next line's first run
        while ready and (not running or busy + min(jobs, len(ready[0].seeds)) <= jobs):
            sweep = ready.pop(0)
            waiting.remove(sweep)
            log = log_path(study, sweep)
            log.parent.mkdir(parents=True, exist_ok=True)
            cmd = command(study, sweep, jobs, extra)
            verb = "evaluating" if sweep.evaluates or sweep.pretrained else "training"
            seeds = "" if sweep.pretrained else f" seed={','.join(map(str, sweep.seeds))}"
            print(f"study {study.name}: {verb} {sweep.stage} {sweep.name}{seeds} (log: {log})", flush=True)
            with open(log, "a") as f:
                f.write("$ " + shlex.join(cmd) + "\n")
                f.flush()
                proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
            running.append((sweep, proc, log))
            busy += min(jobs, len(sweep.seeds))
        time.sleep(1.0)
        if time.monotonic() - last_export >= EXPORT_EVERY:  # a sweep's seeds run one after another
            last_export = time.monotonic()
            for sweep, proc, _ in running:
                for dest in export(study, sweep):
                    exported.setdefault(proc.pid, set()).add(dest)
                    print(f"study {study.name}: exported {dest}", flush=True)
        for item in [r for r in running if r[1].poll() is not None]:
            running.remove(item)
            sweep, proc, log = item
            written = exported.pop(proc.pid, set()) | set(export(study, sweep))
            stopped = proc.returncode != 0 and stop.signalled_at is not None
            state = "done" if proc.returncode == 0 else "stopped" if stopped else f"FAILED (exit {proc.returncode})"
            ended += len(sweep.seeds) if proc.returncode == 0 else 0
            settled += len(sweep.seeds)
            left = (f", about {_duration((time.monotonic() - began) * (total - settled) / settled)} left at its pace "
                    "so far" if settled < total and not stop.due() else "")
            print(f"study {study.name}: {sweep.stage} {sweep.name} {state}; exported {len(written)} run(s); "
                  f"{ended} of the {total} run(s) of this command done{left}", flush=True)
            if proc.returncode == 0:
                for metric in derived(study):  # what the finished runs give already
                    metric.after_sweep(study)
            if proc.returncode != 0 and not stopped:
                failed.append(str(log))
                if not (sweep.evaluates or sweep.pretrained):  # else the runs are fine: their other evaluations go on
                    dead.add(sweep.folder)
    return failed


def contrast_text(contrast) -> str:
    """A study's contrast as ``--contrast`` takes it: 'A/B', each side a label or a line key
    (a mapping, written as its flow text: :func:`posbench.report.keys.key_text`)."""
    if isinstance(contrast, str):
        return contrast
    return "/".join(key_text(x) if isinstance(x, dict) else x for x in contrast)


def mark_partial(study: Study, missing: list[str], total: int) -> None:
    """Open report.md and report.html with the line that says the report is partial: how many of
    the study's planned runs it draws, and the folders of those it lacks (every one of them)."""
    from html import escape

    from ..runs.rundir import atomic_write_text

    text = (f"Partial report: {total - len(missing)} of the {total} runs study {study.name} plans are exported and "
            f"drawn here; not yet: {', '.join(missing)}. Every table, figure and verdict below is of the runs drawn "
            f"(posbench study {study.name} --step report --partial).")
    md = study.results / "report.md"
    atomic_write_text(md, f"> **{text}**\n\n" + md.read_text())
    page = study.results / "report.html"
    if page.is_file():
        html = page.read_text()
        at = html.find(">", html.find("<body")) + 1 if "<body" in html else 0
        atomic_write_text(page, html[:at] + f'<p class="warning"><strong>{escape(text)}</strong></p>' + html[at:])


def report_command(study: Study) -> list[str]:
    rep = study.report
    by = [f"--by={k}" for k in rep.get("by") or []]
    per = [f"--per={k}" for k in rep.get("per") or []]
    contrasts = [f"--contrast={contrast_text(c)}" for c in rep.get("contrasts") or []]
    contrasts += ["--missing-contrasts"] if contrasts else []
    return [*_posbench(), "report", *map(str, rep.get("dirs") or []), str(study.runs), "--out", str(study.results),
            *by, *per, *contrasts, *map(str, rep.get("args") or [])]


def report(study: Study) -> None:
    """The study's derived metrics computed (:mod:`.derived`, each where the study declares it),
    ``posbench report`` on the exported runs (and ``dirs`` beside them), then each derived metric's
    sections of its own and each of ``tables``."""
    metrics = derived(study)
    for metric in metrics:
        metric.compute(study)
    subprocess.run(report_command(study), check=True)
    for metric in metrics:
        metric.sections(study)
    from ..report.encoding_table import TABLES
    from ..runs.rundir import atomic_write_text

    for name, kind in (study.report.get("tables") or {}).items():
        if kind in TABLES:  # posbench's own table of report.csv
            atomic_write_text(study.results / name, TABLES[kind](str(study.results / "report.csv")))
            continue
        with open(study.results / name, "w") as f:  # a script of the study's own, its output the file
            subprocess.run([sys.executable, str(kind), str(study.results / "report.csv")], stdout=f, check=True)


def main(args: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="posbench study", description=HELP)
    parser.add_argument("name", nargs="?", help="the study (conf/study/<name>.yaml); none: list the studies")
    parser.add_argument("--config-dir", action="append", default=[], metavar="DIR",
                        help="a dir with study/<name>.yaml files (and the configs its runs use); repeatable")
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side (default 2: two CPU cores)")
    parser.add_argument("--only", default=None, metavar="STAGES", help="comma-separated stages to train (default: all)")
    parser.add_argument("--where", action="append", default=[], metavar="KEY=V1,V2",
                        help="train only the runs whose grid point sets KEY to one of the values (repeatable; "
                             "seed=1 picks a seed): --where encoding=alibi,rope --where seed=1")
    parser.add_argument("--step", default="all", choices=["all", "plan", "train", "export", "report"],
                        help="plan: list what would train; train: train (and export) without the report; "
                             "export: export finished runs; report: draw the exported runs")
    parser.add_argument("--partial", action="store_true",
                        help="draw the report although planned runs are not exported yet, the report.md and "
                             "report.html marked partial with the runs they lack (else a study refuses to report)")
    parser.add_argument("--seed-major", action="store_true",
                        help="train the first seed of every line, then the second, ...: a study cut off early "
                             "(a GPU slot's end) holds one seed of every line rather than every seed of a few")
    parser.add_argument("--deadline", type=float, default=None, metavar="S",
                        help="stop after S seconds (as at SIGINT or SIGTERM): nothing new starts, running runs save "
                             "a checkpoint and stop, finished ones are exported; the same command resumes")
    parser.add_argument("--extra", action="append", default=[], metavar="OVERRIDE",
                        help="an override added to every run that keeps its hash (train.compile=false, device=cuda)")
    ns = parser.parse_args(args)
    dirs = [Path(d) for d in ns.config_dir]
    if ns.name is None:
        for name, path in study_files(dirs).items():
            print(f"{name:<16} {describe_study(path)}")
        return
    if ns.jobs < 1:
        raise PosbenchError(f"study: --jobs {ns.jobs} is not valid; valid: a count of runs >= 1")
    if ns.deadline is not None and not ns.deadline > 0:
        raise PosbenchError(f"study: --deadline {ns.deadline:g} is not valid; valid: seconds > 0")
    study = load_study(ns.name, dirs)
    study.config_dirs = [d.resolve() for d in dirs]
    only = [s for s in ns.only.split(",") if s] if ns.only else None
    where = parse_where(ns.where)
    chosen = restrict(study, sweeps(study, only), where)  # --only and --where checked before anything is written
    if ns.step == "plan" or not (ns.step in ("all", "train") or study.out.is_dir()):
        return steps(study, ns, only, where, chosen)
    from ..runs.lock import hold

    made = not study.out.exists()
    try:
        with hold(study.out, "study"):  # one study of a file at a time: a second one is refused in one line
            steps(study, ns, only, where, chosen)
    finally:
        if made and study.out.is_dir() and not any(study.out.iterdir()):
            study.out.rmdir()  # a study that stopped before its first run leaves no empty folder


def steps(study: Study, ns: argparse.Namespace, only: list[str] | None, where: dict[str, set[str]],
          chosen: list[Sweep]) -> None:
    """The steps ``ns.step`` names of a loaded study (``chosen``: the sweeps ``only`` and ``where``
    pick): plan, train (and export), export, report. A study that trains ends with every run it
    planned exported, or with one line naming the runs that are not (:func:`missing_runs`). A
    report is drawn only when every run of every stage is exported (:func:`unreported`), else the
    step refuses in one line naming those it would lack; ``--partial`` draws it and opens it with
    that line (:func:`mark_partial`), so a partial report is never read as a whole one."""
    if ns.step in ("all", "plan", "train"):
        todo, have = plan(study, only, ns.extra, where)
        kept, orphans = orphaned(study, todo)
        stuck = sum(len(s.seeds) for s in todo) - sum(len(s.seeds) for s in kept)
        todo = seed_major(kept) if ns.seed_major else kept
        total = have + stuck + sum(len(s.seeds) for s in todo)
        evals = sum(len(s.seeds) for s in todo if s.evaluates or s.pretrained)
        pending = len(unexported_runs(study, chosen))
        print(f"study {study.name}: {have} of {total} runs done; {total - have - evals - stuck} to train"
              + (f", {evals} to evaluate" if evals else "") + (f", {stuck} cannot start (below)" if stuck else "")
              + (f"; {pending} finished run(s) to export" if pending else ""))
        for line in orphans:
            print(f"study {study.name}: {line}", flush=True)
        if ns.step == "plan":
            print_plan(study, todo, ns.jobs, ns.extra)
            return
        stop = Stop(ns.deadline)
        failed = train(study, todo, ns.jobs, ns.extra, stop)
        written = [dest for s in sweeps(study, only) for dest in export(study, s)]  # those no sweep's end exported
        if written:
            print(f"study {study.name}: exported {len(written)} finished run(s) that were not", flush=True)
        if stop.reason is not None:
            left, done = plan(study, only, ns.extra, where)
            raise PosbenchError(f"study {study.name}: stopped because {stop.reason}: {done} of {total} runs done, "
                                f"{sum(len(s.seeds) for s in left)} left; re-run the same command to resume them "
                                "(a stopped run from its checkpoint)")
        if failed:
            raise PosbenchError(f"study {study.name}: {len(failed)} sweep(s) failed; their logs: {', '.join(failed)}")
        if orphans:
            raise PosbenchError(f"study {study.name}: {stuck} branch run(s) could not start, their parents' runs "
                                f"not under {study.out}; valid: what the lines above name (train those seeds whole as "
                                "they say, or choose the parents' stage)")
        missing = missing_runs(study, only, ns.extra, where, chosen)
        if missing:
            raise PosbenchError(f"study {study.name}: {len(missing)} planned run(s) are not exported after training: "
                                f"{_named(missing)}; re-run the same command to train and export them")
    if ns.step == "export":
        n = sum(len(export(study, s)) for s in sweeps(study, only))
        print(f"study {study.name}: exported {n} run(s) to {study.runs}")
    if ns.step in ("all", "report"):
        pending = [str(run) for run in unexported_runs(study, chosen)]
        if pending:
            raise PosbenchError(f"study {study.name}: {len(pending)} finished run(s) under {study.out} are not "
                                f"exported, so the report would lack them: {_named(pending)}; valid: posbench study "
                                f"{study.name} --step export (or the plain command), then report")
        missing, total = unreported(study, ns.extra)
        if len(missing) == total:  # read once: unreported's exports are the ones the report would draw
            raise PosbenchError(f"study {study.name}: none of its {total} planned runs is exported under {study.runs}, "
                                f"so there is nothing to report yet; valid: posbench study {study.name} to train and "
                                "export them")
        if missing and not ns.partial:
            raise PosbenchError(f"study {study.name}: {len(missing)} of its {total} planned runs are not exported, so "
                                f"its report would be partial: {_named(missing)}; valid: posbench study {study.name} "
                                f"to train them, or --step report --partial for a report of the "
                                f"{total - len(missing)} that are, marked partial")
        report(study)
        if missing:
            mark_partial(study, missing, total)


def print_plan(study: Study, todo: list[Sweep], jobs: int, extra: list[str]) -> None:
    """Each sweep to run with what it costs (:mod:`posbench.study.costs`: training tokens, time at
    this machine's measured throughput, peak memory), then its command; the study's totals."""
    tokens, seconds, unknown = 0, 0.0, 0
    for s in todo:
        cost = sweep_cost(study, s, extra)
        what = cost.text() if cost else "evaluates: no training (a pretrained model's or trained runs' rows)"
        print(f"  {s.stage} {s.name}: {what}")
        print("    " + shlex.join(command(study, s, jobs, extra)))
        if cost:
            tokens += cost.runs * cost.tokens
            seconds += cost.runs * (cost.seconds or 0.0)
            unknown += cost.runs if cost.seconds is None else 0
    if tokens:
        left = f", and {unknown} run(s) of unknown time" if unknown else ""
        print(f"study {study.name}: {_tokens(tokens)} training tokens to train; about {_duration(seconds)} of "
              f"training one run at a time on this machine{left} (--jobs runs side by side)")


def unexported_runs(study: Study, chosen: list[Sweep]) -> list[Path]:
    """The finished runs of the sweeps ``chosen`` that their exports lack (:func:`unexported`)."""
    return [run for s in chosen for run, _ in unexported(study, s)]


def missing_runs(study: Study, only, extra: list[str], where, chosen: list[Sweep]) -> list[str]:
    """The planned runs a study lacks once it has trained: those its plan still lists (a job
    refused or ended without its rows), and finished ones whose export is missing
    (:func:`unexported_runs` of ``chosen``). -> their folders under ``out`` (``rope/seed=1``)."""
    left, _ = plan(study, only, extra, where)
    named = [f"{s.folder}" + ("" if s.pretrained else f"/seed={seed}") for s in left
             for seed in (s.seeds if not s.pretrained else [None])]
    named += [str(run.relative_to(study.out)) for run in unexported_runs(study, chosen)]
    return list(dict.fromkeys(named))


def _named(items: list[str], shown: int = 6) -> str:
    return ", ".join(items[:shown]) + (f" and {len(items) - shown} more" if len(items) > shown else "")
