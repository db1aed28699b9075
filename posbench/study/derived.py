"""Derived metrics of a study: computed from its runs' outputs after they finish, not by
``posbench eval``, kept under the study's ``runs/`` and reported as sections of their own.

Each is one class (:class:`Derived`), declared by a key of the study file's ``report:``
(``report.longppl``) and found by :func:`derived`; the runner asks each, by the same three
calls, for what the finished runs give already (:meth:`Derived.after_sweep`, after each sweep),
for its rows before the report (:meth:`Derived.compute`) and for its own sections after it
(:meth:`Derived.sections`), so the runner names none of them. LongPPL (:class:`LongPPL`, Fang et
al. 2025; :mod:`posbench.eval.longppl`) is the one posbench has.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import ClassVar

from ..errors import PosbenchError
from .spec import Study, sweeps


class Derived:
    """A metric computed from a study's runs, declared by ``report.<key>``."""

    key: ClassVar[str] = ""

    def after_sweep(self, study: Study) -> None:
        """What the finished runs give already: a line, not a failure, where it cannot be computed yet."""

    def compute(self, study: Study) -> Path | None:
        """Its rows, before the report (which reads them). -> the file written, or None."""
        return None

    def sections(self, study: Study) -> list[Path]:
        """Its sections of its own, after the report. -> the files written."""
        return []


class LongPPL(Derived):
    """LongPPL and its sensitivities (``report.longppl``: :func:`longppl`, :func:`sensitivity_reports`)."""

    key = "longppl"

    def after_sweep(self, study: Study) -> None:
        _longppl_so_far(study)

    def compute(self, study: Study) -> Path | None:
        return longppl(study)

    def sections(self, study: Study) -> list[Path]:
        return sensitivity_reports(study)


DERIVED: tuple[Derived, ...] = (LongPPL(),)


def derived(study: Study) -> list[Derived]:
    """The derived metrics ``study`` declares (a ``report:`` key of theirs set), in order."""
    return [metric for metric in DERIVED if study.report.get(metric.key)]


def longppl(study: Study) -> Path | None:
    """The study's ``report.longppl``: LongPPL (:mod:`posbench.eval.longppl`) of every row of its
    folders under ``out`` that kept per-token NLLs, on the key tokens of the folder it names, written
    to ``runs/longppl.csv`` for the report. -> that file, or None where there are no key tokens yet.

    Outputs may be lost between machines while a study's runs export one by one, so what LongPPL
    needs is exported too: the key tokens to ``runs/longppl_keys.npz`` (:meth:`KeyTokens.save`) as
    soon as the evaluator's rows are under ``out``, and each run's rows to runs/longppl.csv, where
    they stay when that run's per-token NLLs are gone (:func:`posbench.eval.longppl.longppl_table`).
    Where the evaluator's folder is made again without the two rows the saved key tokens came from
    (:meth:`~posbench.eval.longppl.KeyTokens.chosen_in`), the saved key tokens stand.
    The study runner calls this after each sweep (:func:`_longppl_so_far`); exported runs that have
    no LongPPL row and no per-token NLLs left are named with how to train them again.

    Each of ``sensitivity`` (NAME: a change of the thresholds or contexts) is the same computation
    on the key tokens so chosen, kept the same way in ``runs/longppl_NAME.csv`` and
    ``runs/longppl_NAME_keys.npz``: a stated sensitivity of the study's LongPPL, which the report
    does not mix into its own (:func:`report` writes each its section)."""
    spec = study.report.get("longppl")
    if not spec:
        return None
    main = {k: v for k, v in spec.items() if k != "sensitivity"}
    dest = _longppl_rows(study, main, *longppl_files(study))
    if dest is not None:
        for label, change in (spec.get("sensitivity") or {}).items():
            _longppl_rows(study, {**main, **change}, *longppl_files(study, label))
    return dest

def longppl_files(study: Study, label: str | None = None) -> tuple[Path, Path]:
    """(rows, key tokens) of the study's LongPPL under ``runs``: longppl.csv and longppl_keys.npz
    (:data:`posbench.eval.longppl.FILE`, ``KEYS``), or for its sensitivity ``label``
    longppl_LABEL.csv and longppl_LABEL_keys.npz."""
    from ..eval.longppl import FILE, KEYS

    if label is None:
        return study.runs / FILE, study.runs / KEYS
    stem = Path(FILE).stem
    return study.runs / f"{stem}_{label}.csv", study.runs / KEYS.replace(f"{stem}_", f"{stem}_{label}_", 1)

def _longppl_rows(study: Study, spec: dict, dest: Path, saved: Path) -> Path | None:
    """:func:`longppl` for one setting: its rows to ``dest``, its key tokens to ``saved``."""
    from ..eval.longppl import load_keys, longppl_table, study_keys
    from ..eval.results import RESULTS, find_files, read_table
    from ..runs.rundir import atomic_write_text

    evaluator = study.out / str(spec["evaluator"])
    folders = sorted({study.out / s.folder for s in sweeps(study, None)})
    runs = sorted({f.parent for f in find_files([f for f in folders if f.is_dir()], RESULTS)})
    kept = read_table(dest) if dest.is_file() else None
    before = load_keys(saved) if saved.is_file() else None
    # a folder made again that lacks the rows the saved key tokens came from: those stand
    stand = before is not None and before.agrees(spec) and not before.chosen_in(evaluator)
    if (evaluator / RESULTS).is_file() and not stand:
        thresholds = {k: float(spec[k]) for k in ("alpha", "beta") if k in spec}
        keys = study_keys(evaluator, runs, spec.get("short"), spec.get("short_stride"), spec.get("long"),
                          **thresholds)
        if kept is not None and len(kept) and before is not None and not keys.same_as(before):
            raise PosbenchError(f"study {study.name}: the key tokens of {evaluator} differ from those saved in "
                                f"{saved}, on which {dest} was computed (the evaluator trained or evaluated again); "
                                f"valid: the evaluator that chose them, or remove {dest} and {saved} to compute "
                                "every row again (exported runs whose per-token NLLs are gone then train again)")
        keys.save(saved)
    elif before is not None:
        keys = before
    else:
        left = f"; {dest} kept as it is" if dest.is_file() else ""
        print(f"study {study.name}: no LongPPL: the evaluator's rows are not under {evaluator}{left}", flush=True)
        return None
    table = longppl_table(keys, runs, kept)
    atomic_write_text(dest, table.to_csv(index=False))
    print(f"study {study.name}: LongPPL of {len(table)} row(s) on the key tokens of {keys.evaluator} -> {dest}",
          flush=True)
    _without_longppl(study, table, dest)
    return dest

def _without_longppl(study: Study, table, dest: Path) -> None:
    """Name the exported runs with no row in ``table`` (``dest``'s): trained before the key tokens
    existed, their per-token NLLs gone with ``out`` (a fresh machine); removing the export trains
    them again."""
    from ..eval.results import RESULTS, find_files, read_results

    have = {(str(h), int(s)) for h, s in zip(table.config_hash, table.seed)}
    folders = [study.runs / s.folder for s in sweeps(study, None) if not s.pretrained]
    lacking = []
    for f in find_files([f for f in sorted(set(folders)) if f.is_dir()], RESULTS):
        rows = read_results(f)
        if len(rows) and not any((str(h), int(s)) in have for h, s in zip(rows.config_hash, rows.seed)):
            lacking.append(f.parent)
    if lacking:
        again = " ".join(shlex.quote(str(p)) for p in lacking)
        print(f"study {study.name}: {len(lacking)} exported run(s) have no LongPPL in {dest.name} and no "
              f"per-token NLLs under {study.out}; to train them again: rm -r {again}", flush=True)

def _longppl_so_far(study: Study) -> None:
    """LongPPL of what has finished (:func:`longppl`), where the evaluator's rows exist: a line, not a
    failure, where they are not complete yet (its short row still to evaluate)."""
    try:
        longppl(study)
    except PosbenchError as e:
        print(f"study {study.name}: no LongPPL yet: {e}", flush=True)

def sensitivity_reports(study: Study) -> list[Path]:
    """Each ``report.longppl.sensitivity`` NAME's LongPPL section (the report's, on its rows in
    runs/longppl_NAME.csv) to results/longppl_NAME.md, with its summary .csv and figure. -> the
    .md files written."""
    from ..eval.results import read_table
    from ..report.longppl import longppl_section
    from ..runs.rundir import atomic_write_text

    written = []
    for label, change in ((study.report.get("longppl") or {}).get("sensitivity") or {}).items():
        rows_file, _ = longppl_files(study, label)
        if not rows_file.is_file():
            print(f"study {study.name}: no LongPPL sensitivity {label}: {rows_file} is not written yet", flush=True)
            continue
        said = ", ".join(f"{k} {v}" for k, v in change.items())
        text, _ = longppl_section(read_table(rows_file), study.results, rows_file.stem,
                                  f"LongPPL sensitivity {label} ({said})")
        if text:  # the section's "## title" as the file's title
            md = study.results / f"{rows_file.stem}.md"
            atomic_write_text(md, f"# {study.name}: {text.lstrip().removeprefix('## ')}")
            written.append(md)
    return written
