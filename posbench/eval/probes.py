"""Probes: measurements of a trained language model other than the perplexity ladder, one
registry of them (built-in, entry point ``posbench.probes`` or ``_target_``, as encodings).

``posbench eval probe=NAME checkpoint=<run dir>`` (or ``pretrained=PATH``) runs one: :func:`run_probe`
builds the probe from ``cfg.probe``, opens the trained run or pretrained model as a :class:`Subject`
(:mod:`posbench.eval.subject`: the model and everything needed to feed it) and
:func:`probe_subject` hands it to the probe with the lengths to probe.
The probe returns rows; they are merged into the run's ``<name>.csv`` by the run's identity
(:data:`RUN_KEY`) and the probe's own :attr:`Probe.key`, and ``probes.json`` in the run dir
records how to import the probe again (a ``_target_`` probe's report in a new process).

A probe (docs/extending.md) subclasses :class:`posbench.eval.probe.Probe`:

* ``Options``: a dataclass of its options (``probe.<option>=``); its defaults are the config of
  an entry-point probe, which needs no YAML;
* :meth:`Probe.run`: the rows, one dict per cell, each with ``status`` ("ok", or "n/a: why"
  where a length cannot be represented);
* ``key``: the columns that identify a row besides the run (e.g. length and depth); ``metric``:
  the column the report draws, a score in [0, 1]; ``grid``: a second key drawn as the rows of
  its heat map (passkey: depth), None for one row per line.

The built-in probes: passkey retrieval (:mod:`.passkey`), RULER's needles with distractors,
``niah_multikey`` and ``niah_multivalue`` (:mod:`.needles`), and RULER's variable tracking,
``variable_tracking`` (:mod:`.tracking`).
"""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from ..config import code_version, config_hash, typed
from ..errors import PosbenchError
from ..methods import Applied
from ..plugins import META_KEYS, TARGET, Registry
from ..runs.rundir import RunDir, atomic_write_text
from .needles import NiahMultiKey, NiahMultiValue
from .passkey import Passkey
from .probe import RUN_KEY, TRAILER, Probe, Subject
from .results import METHOD, locked, merge_csv
from .subject import open_subject
from .tracking import VariableTracking

__all__ = ["PROBES", "Probe", "Subject", "build_probe", "run_probe", "probe_subject", "probe_files"]

def _options(cls: type[Probe]) -> dict:
    return dataclasses.asdict(cls.Options())


PROBES = Registry("probe", Probe, "posbench.probes", _options)


def build_probe(node) -> Probe:
    """The probe a ``probe`` config names, with its options checked."""
    values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    cls = PROBES.class_of(values)
    options = {k: v for k, v in values.items() if k not in META_KEYS and k != "name"}
    return cls(typed(cls.Options, options, "probe"))


def run_probe(cfg: DictConfig) -> tuple[Probe, pd.DataFrame]:
    """``posbench eval probe=NAME checkpoint=<run>`` or ``pretrained=PATH``: the probe's rows of the
    subject :func:`~posbench.eval.subject.open_subject` opens (:func:`probe_subject`)."""
    probe = build_probe(cfg.probe)
    return probe, probe_subject(open_subject(cfg), probe, cfg.probe)


def probe_subject(subject: Subject, probe: Probe, node=None) -> pd.DataFrame:
    """A probe of a trained run or a pretrained model at the probe's lengths, under the subject's
    RoPE scaling and extension; the rows merged into ``subject.out``'s ``<name>.csv`` (rows of the
    same key replaced). -> this evaluation's rows."""
    subject.check_probe(probe)
    lengths = probe.lengths(subject.train_len)
    subject.probe_preflight(lengths)
    with subject.model.encoding.extended(subject.ext):
        found = probe.run(subject, lengths)
    rows = probe_rows(probe, subject.rows_config, found, Applied.of(subject.ecfg.rope_scaling, subject.ext))
    subject.prepare_out()  # once there is something to write
    write_probe(RunDir(subject.out), probe, rows, node)
    return rows


def probe_rows(probe: Probe, train_cfg: DictConfig, found: list[dict], applied: Applied) -> pd.DataFrame:
    """A probe's rows with the run's identity in front (``applied``: the scaling and method, named
    by the ``rope_scaling`` key and carried as the METHOD columns at the end) and its config hash
    and code version."""
    meta = {"encoding": train_cfg.encoding.name, **applied.columns(),
            "train_len": int(train_cfg.train.train_len), "seed": int(train_cfg.seed),
            "config_hash": config_hash(train_cfg), "code_version": code_version()}
    rows = pd.DataFrame([{**meta, **row} for row in found])
    own = [c for c in rows if c not in RUN_KEY + list(probe.key) + TRAILER + METHOD]
    return rows[RUN_KEY + list(probe.key) + own + TRAILER + METHOD].astype(probe.dtypes)


def write_probe(run: RunDir, probe: Probe, rows: pd.DataFrame, node=None) -> pd.DataFrame:
    """Merge rows into the run's ``<name>.csv`` atomically, and record in ``probes.json`` how to
    import the probe (its ``_target_``, if any) and the options that made the rows."""
    with locked(run.path):
        merged = merge_csv(run.path / f"{probe.name}.csv", rows, RUN_KEY + list(probe.key))
        index = run.path / "probes.json"
        known = json.loads(index.read_text()) if index.is_file() else {}
        values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
        known[probe.name] = {TARGET: values.get(TARGET), "options": dataclasses.asdict(probe.options)}
        atomic_write_text(index, json.dumps(known, indent=1, sort_keys=True) + "\n")
    return merged


def probe_files(run_dir) -> dict[str, type[Probe] | None]:
    """The probes whose rows a run dir holds -> their class (None where it cannot be imported
    here: its rows are still read, drawn with the defaults of :class:`Probe`)."""
    from pathlib import Path

    run_dir = Path(run_dir)
    index = run_dir / "probes.json"
    known = json.loads(index.read_text()) if index.is_file() else {}
    found: dict[str, type[Probe] | None] = {}
    for name in sorted(set(PROBES.members) | set(known)):
        if not (run_dir / f"{name}.csv").is_file():
            continue
        try:
            found[name] = PROBES.class_of({"name": name, TARGET: (known.get(name) or {}).get(TARGET)})
        except PosbenchError:
            found[name] = None
    return found


for _cls in (Passkey, NiahMultiKey, NiahMultiValue, VariableTracking):
    PROBES.register(_cls)
PROBES.load()
