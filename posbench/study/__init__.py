"""``posbench study NAME``: a study is data, a YAML file; this module trains what it lacks and reports.

A study file (``conf/study/<name>.yaml``, or a user's own through ``--config-dir DIR``) says::

    description: one line
    out: outputs/study/scale          # where its runs train (run dirs)
    runs: results/scale/runs          # where finished runs are exported (per-block NLL sums, a
                                      # few KiB each: what the report needs, small enough to commit)
    results: results/scale            # where the report goes
    folder: "{stage}/{point}"         # a grid point's runs, under out and runs (optional; the default);
                                      # {stage}, {point} (its overrides) or any grid key: "{encoding}";
                                      # a stage's own ``folder:`` replaces it for that stage
    common: [experiment=scale]        # overrides every run shares
    stages:                           # in order; ``--only`` picks some
      - name: small
        grid: {model: [small], encoding: [rope, alibi], seed: [0, 1, 2]}
        overrides: [train.compile=false]   # this stage's own (optional)
    report:
      by: [model.name]                # posbench report --by
      dirs: [results/baselines/headline]   # reported beside the study's runs (optional)
      args: [--log-y]                 # any other posbench report flags
      contrasts: [[p_rope, rope]]     # verdicts on line A's ratio over line B's (posbench report --contrast)
      tables: {encodings.md: scripts/encoding_table.py}   # FILE: a script run on report.csv, its
                                      # output written to results/FILE (optional)

A run is keyed by its config hash and seed, not by its path: ``posbench study`` composes each
run's config as ``posbench train`` would, and trains only the runs whose (hash, seed) neither an
exported run under ``runs`` nor a finished run dir under ``out`` holds. Re-running resumes: an
unfinished run trains on in the same run dir (``posbench train`` resumes from its checkpoint).
An algorithmic task's run (``task=copy``, ...) writes tasks.csv instead of results.csv: it is
keyed by that file's hash and seed, and exported as its tasks.csv and config.yaml.

The runs of one grid point that differ only in seed go to Hydra's ``local_parallel`` launcher as
one sweep (``posbench -m train ... seed=0,1,2``); several such sweeps run side by side until
``--jobs`` runs are going. Each sweep's finished runs are exported as soon as it ends, so a study
cut off (a time limit, a lost machine) keeps every run that finished. Then ``posbench report``
draws the exported runs.

The hash of a run that starts from another (``train.init_from``) covers its parent's hash, which
exists only once the parent has trained: such runs are keyed by their run dir alone.

**A stage that starts from another's runs** names it with ``from:``; ``{from}`` in its overrides
is the run dir of the same grid point (the grid keys both stages have) and seed in that stage::

      - name: long                    # 20M tokens, keeping the shorter budgets' branch points
        grid: {encoding: [alibi, rope], seed: [0, 1, 2]}
        overrides: [train.schedule=wsd, "train.save_steps=[977,390]"]
      - name: steps1221               # its decay from the long run's checkpoint at step 977
        from: long
        grid: {encoding: [alibi, rope], seed: [0, 1, 2]}
        overrides: [train.schedule=wsd, train.steps=1221, "train.branch_from={from}"]

A sweep of such a stage starts only once its parent sweep has ended (and not at all when the
parent failed): its checkpoints live in the parent's run dirs under ``out``, so a parent and its
branches train on one machine.

**An eval stage** (``eval: true``, with ``from:``) trains nothing: it runs ``posbench eval`` on each
run of the stage its ``from:`` names (the same grid point and seed), as
``posbench -m eval checkpoint=<run dir>,... <overrides>``. Its grid keys that the parent's grid has
pick the parent's point; its other grid keys (``eval.rope_scaling: [pi, yarn]``) and its overrides
are the evaluation's (``eval.*``, and of ``--extra`` only ``device``, ``eval.*`` and ``precision``)::

      - name: sliding
        eval: true
        from: headline
        grid: {encoding: [alibi, rope], seed: [0, 1, 2]}
        overrides: [eval.mode=sliding, eval.stride=64, "eval.lengths=[256,512,1024,2048]"]

Its runs are its parent's: the rows go to the parent's run dirs (``out/<folder>/seed=N``) and the
run is exported, with every row it holds, to the parent's ``runs/<folder>/seed=N``. An evaluation
is done (:func:`evaluated`) when its run dir holds the rows ``posbench eval`` would otherwise
compute, by the eval's own test (``posbench.eval.ladder.ladder_plan``: rows of results.csv with the
evaluation's key (split, mode, stride, rope_scaling, eval_len), the run's config hash and scored
token count, status ok, and their per-token NLL kept); where only the export is left, when its
results.csv has an ok row of the run's config hash under that key at every length. An eval sweep
starts once its parent's sweep and every earlier sweep on the same run dirs has ended (``posbench
eval`` holds the run dir), and an export is written again when its run's results.csv holds a row
(key and config hash) the export lacks; a training run's export is written once, when it ends.
To evaluate another study's runs, an eval study names that study's stage as its own first stage,
with the same config, ``out`` and ``folder`` (conf/study/rope_scaling.yaml, headline_sliding.yaml):
the runs are then done in both, and trained by whichever runs first (an evaluation needs the run
dir's checkpoint: a run whose only copy is an export is done for training, not for a new
evaluation). An eval stage may run a probe (``probe=passkey`` in its overrides): it is done when the
probe's csv in the run dir or its export holds rows of the run's config hash under the
evaluation's label at every length the probe runs (:func:`_probed`), and the probe's csv travels
with the export.

**A pretrained stage** (``pretrained: NAME``, a model name of ``posbench eval pretrained=`` or a
path) trains nothing: each grid point is one ``posbench eval pretrained=NAME out=<out/folder>``
with the point's and the stage's overrides (``eval.*``, ``bos``, ``precision``, ``probe=...``), no
seeds. Every stage of one model names the same folder (``folder: "{pretrained}"``, ``{pretrained}``
being the model's name), so a method's lengths that leave the model as trained reuse the unscaled
rows there, and the sweeps on one folder run one after another::

      - name: ladder
        pretrained: smollm2-135m
        grid: {eval.rope_scaling: [none, pi, ntk, dynamic_ntk, yarn]}
        overrides: ["eval.lengths=[1024,2048,4096,8192,16384,32768]", eval.max_tokens=32768]
      - name: passkey
        pretrained: smollm2-135m
        grid: {}
        overrides: [probe=passkey, "probe.lengths=[2048,4096,8192,16384]", "probe.depths=[0,0.5,1]"]

What is done is read without the weights (the model's config and tokenizer,
:func:`pretrained_left`): a ladder sweep is done when ``posbench eval`` would compute no length,
a probe sweep runs only the lengths whose rows its csv lacks. The folder is exported to
``runs/<folder>`` (results, per-block sums, every probe's csv) as its rows come, keeping the rows of
an earlier export that a folder made again lacks; an export alone also counts as done.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
import yaml

from .config import conf_dir, config_hash, task_config
from .errors import PosbenchError

STUDY_KEYS = ("description", "out", "runs", "results", "folder", "common", "stages", "report")
STAGE_KEYS = ("name", "grid", "overrides", "from", "eval", "pretrained", "folder")
REPORT_KEYS = ("by", "dirs", "args", "tables", "contrasts")
FOLDER = "{stage}/{point}"


@dataclass(frozen=True)
class Sweep:
    """The runs of one grid point of one stage: the same overrides, one seed each."""

    stage: str
    overrides: tuple[str, ...]  # the grid point's own, then the stage's
    seeds: tuple[int, ...]
    folder: str = ""  # its runs' folder under out and runs: out/<folder>/seed=N
    parent: str = ""  # the folder of the sweep its runs start from (a stage's ``from``), or none
    evaluates: bool = False  # an eval stage's: ``posbench eval`` on the parent's runs (folder == parent)
    pretrained: str = ""  # a pretrained stage's model (``posbench eval pretrained=...``; its rows go to out/<folder>)

    @property
    def name(self) -> str:
        return ",".join(o for o in self.overrides if "=" in o).replace("/", "_") or "default"


@dataclass
class Study:
    name: str
    description: str
    out: Path
    runs: Path
    results: Path
    common: list[str]
    stages: list[dict]
    report: dict = field(default_factory=dict)
    folder: str = FOLDER
    config_dirs: list[Path] = field(default_factory=list)  # --config-dir: passed to every run


def study_files(config_dirs: list[Path]) -> dict[str, Path]:
    """Study name -> file, the user's config dirs first (a user's study of a built-in's name wins)."""
    found: dict[str, Path] = {}
    for base in [*config_dirs, conf_dir()]:
        for path in sorted((Path(base) / "study").glob("*.yaml")):
            found.setdefault(path.stem, path)
    return found


def _unknown(where: str, data: dict, valid: tuple[str, ...]) -> None:
    bad = [k for k in data if k not in valid]
    if bad:
        raise PosbenchError(f"study: {where} has an unknown key {bad[0]!r}; valid keys: {', '.join(valid)}")


def load_study(name: str, config_dirs: list[Path] = ()) -> Study:
    files = study_files(list(config_dirs))
    if name not in files:
        raise PosbenchError(f"study {name!r} is not known; valid choices: {', '.join(sorted(files)) or 'none'} "
                            "(conf/study/*.yaml, or --config-dir DIR with DIR/study/<name>.yaml)")
    data = yaml.safe_load(files[name].read_text()) or {}
    _unknown(str(files[name]), data, STUDY_KEYS)
    for key in ("out", "runs", "results", "stages"):
        if not data.get(key):
            raise PosbenchError(f"study: {files[name]} lacks {key!r}; a study says out, runs, results and stages")
    for i, stage in enumerate(data["stages"]):
        _unknown(f"{files[name]} stage {i}", stage, STAGE_KEYS)
        if not stage.get("name") or not isinstance(stage.get("grid"), dict):
            raise PosbenchError(f"study: {files[name]} stage {i} needs a name and a grid (key: [values])")
        if stage.get("eval") and not stage.get("from"):
            raise PosbenchError(f"study: {files[name]} stage {stage['name']} has eval: true and no from:; an eval "
                                "stage evaluates the runs of the earlier stage its from: names")
        if stage.get("pretrained"):
            _check_pretrained_stage(files[name], stage)
    _unknown(f"{files[name]} report", data.get("report") or {}, REPORT_KEYS)
    return Study(name, data.get("description", ""), Path(data["out"]), Path(data["runs"]), Path(data["results"]),
                 list(data.get("common") or []), list(data["stages"]), dict(data.get("report") or {}),
                 str(data.get("folder") or FOLDER))


def _check_pretrained_stage(path: Path, stage: dict) -> None:
    """A pretrained stage evaluates one model: no seeds, no parent stage."""
    for key in ("from", "eval"):
        if stage.get(key):
            raise PosbenchError(f"study: {path} stage {stage['name']} has pretrained: and {key}:; valid: a "
                                "pretrained stage evaluates its model by itself (no from:, no eval:)")
    if "seed" in stage["grid"]:
        raise PosbenchError(f"study: {path} stage {stage['name']} has pretrained: and a seed in its grid; valid: "
                            "grid keys of posbench eval (eval.rope_scaling, bos, ...): a pretrained model has one seed")


def sweeps(study: Study, only: list[str] | None = None) -> list[Sweep]:
    """Every grid point of the chosen stages (all by default), in the file's order."""
    names = [s["name"] for s in study.stages]
    for n in only or []:
        if n not in names:
            raise PosbenchError(f"study {study.name}: --only {n!r} is not one of its stages; valid choices: "
                                f"{', '.join(names)}")
    out, folders, shared = [], {}, set()  # shared: the pretrained stages' folders
    points: dict[str, list[tuple[dict, str]]] = {}  # stage -> (grid point, folder) of each of its sweeps
    for stage in study.stages:
        grid = {k: (v if isinstance(v, list) else [v]) for k, v in stage["grid"].items()}
        seeds = tuple(int(s) for s in grid.pop("seed", [0]))
        keys = list(grid)
        for values in itertools.product(*(grid[k] for k in keys)):
            if stage.get("pretrained"):  # its folder may be shared: every method's rows in one run dir
                sweep = _pretrained_sweep(study, stage, dict(zip(keys, values)))
                if sweep.folder in folders:
                    raise PosbenchError(f"study {study.name}: {folders[sweep.folder]} and pretrained stage "
                                        f"{sweep.stage} share the folder {sweep.folder!r}; put more grid keys in "
                                        "its folder")
                shared.add(sweep.folder)
                if not only or stage["name"] in only:
                    out.append(sweep)
                continue
            if stage.get("eval"):  # no folder of its own: its runs are its parent's
                sweep = _eval_sweep(study, stage, dict(zip(keys, values)), seeds, points)
                points.setdefault(stage["name"], []).append((dict(zip(keys, values)), sweep.folder))
                if not only or stage["name"] in only:
                    out.append(sweep)
                continue
            point = tuple(f"{k}={_value(v)}" for k, v in zip(keys, values))
            sweep = Sweep(stage["name"], point + tuple(stage.get("overrides") or []), seeds)
            sweep = replace(sweep, folder=_folder(study, sweep, dict(zip(keys, values)), stage.get("folder")))
            points.setdefault(stage["name"], []).append((dict(zip(keys, values)), sweep.folder))
            if stage.get("from"):
                sweep = _with_parent(study, sweep, stage, dict(zip(keys, values)), points)
            if sweep.folder in folders or sweep.folder in shared:  # over every stage: --only hides no clash
                other = folders.get(sweep.folder, "a pretrained stage")
                raise PosbenchError(f"study {study.name}: {other} and {sweep.stage} {sweep.name} share the folder "
                                    f"{sweep.folder!r}; put more grid keys in its folder")
            folders[sweep.folder] = f"{sweep.stage} {sweep.name}"
            if not only or stage["name"] in only:
                out.append(sweep)
    return out


def _with_parent(study: Study, sweep: Sweep, stage: dict, point: dict, points: dict) -> Sweep:
    """``sweep`` with ``{from}`` in its overrides made the run dir of the same grid point's run in
    the stage it starts from (an earlier stage of the file)."""
    parent = stage["from"]
    if parent not in points or parent == stage["name"]:
        earlier = [n for n in points if n != stage["name"]]
        raise PosbenchError(f"study {study.name}: stage {stage['name']} has from: {parent!r}, which is not an "
                            f"earlier stage; valid choices: {', '.join(earlier) or 'none'}")
    found = [folder for p, folder in points[parent] if all(p[k] == v for k, v in point.items() if k in p)]
    if len(found) != 1:
        raise PosbenchError(f"study {study.name}: stage {stage['name']} point {sweep.name} matches {len(found)} "
                            f"sweeps of stage {parent}; the grid keys they share must name one")
    run = f"'{study.out / found[0]}/seed=${{seed}}'"  # quoted: Hydra reads '=' in a value only so
    overrides = tuple(o.replace("{from}", run) for o in sweep.overrides)
    return replace(sweep, overrides=overrides, parent=found[0])


def _eval_sweep(study: Study, stage: dict, point: dict, seeds: tuple[int, ...], points: dict) -> Sweep:
    """An eval stage's grid point: the grid keys its parent stage has pick the parent's sweep (its
    folder, run dirs and exports are this sweep's); the other keys (``eval.rope_scaling``, ...) and
    the stage's overrides are the ``posbench eval`` overrides."""
    parent = next((s for s in study.stages if s["name"] == stage["from"]), None)
    shared = set(parent["grid"]) - {"seed"} if parent else set()
    own = tuple(f"{k}={_value(v)}" for k, v in point.items() if k not in shared)
    sweep = Sweep(stage["name"], own + tuple(stage.get("overrides") or []), seeds, evaluates=True)
    sweep = _with_parent(study, sweep, stage, {k: v for k, v in point.items() if k in shared}, points)
    return replace(sweep, folder=sweep.parent)


def _pretrained_sweep(study: Study, stage: dict, point: dict) -> Sweep:
    """A pretrained stage's grid point: ``posbench eval pretrained=<model> out=<out/folder>`` with
    the point's and the stage's overrides; its folder is the study's, with ``{pretrained}`` the
    model's name (a study gives every method of one model the same folder, so a method's lengths
    that leave the model as trained reuse the unscaled rows there)."""
    own = tuple(f"{k}={_value(v)}" for k, v in point.items())
    model = str(stage["pretrained"])
    sweep = Sweep(stage["name"], own + tuple(stage.get("overrides") or []), (0,), pretrained=model)
    return replace(sweep, folder=_folder(study, sweep, {"pretrained": Path(model).stem, **point}, stage.get("folder")))


def _folder(study: Study, sweep: Sweep, point: dict, own: str | None = None) -> str:
    """The study's ``folder`` (or the stage's ``own``) for one grid point: {stage}, {point} and the
    grid's keys filled in."""
    named = replace(sweep, overrides=tuple(o for o in sweep.overrides if "{from}" not in o))  # a parent's run dir
    values = {"stage": sweep.stage, "point": named.name, **{k: _value(v).replace("/", "_") for k, v in point.items()}}
    template = own or study.folder
    folder = template
    for key, value in values.items():
        folder = folder.replace("{" + key + "}", value)
    if "{" in folder:
        raise PosbenchError(f"study {study.name}: folder {template!r} names a key stage {sweep.stage} lacks; "
                            f"valid keys: {', '.join(values)}")
    return folder


def _value(v) -> str:
    if isinstance(v, list):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return str(v).lower()
    return "null" if v is None else str(v)


def sweep_hash(study: Study, sweep: Sweep, extra: list[str] = ()) -> str | None:
    """The config hash of a sweep's runs, composed as ``posbench train`` composes it, once for all
    its seeds (the hash leaves the seed out: ``config.NOT_HASHED``); None when the hash depends on
    a run not yet trained (``train.init_from``)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = [*study.common, *sweep.overrides, *extra]
    if study.config_dirs:
        overrides.append("hydra.searchpath=[" + ",".join(f"file://{d}" for d in study.config_dirs) + "]")
    if any(o.split("=", 1)[0].lstrip("+") == "train.init_from" for o in overrides):
        return None
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            cfg = compose("app_train", overrides=overrides)
    except Exception as e:  # Hydra's own errors: a bad override in the study file
        raise PosbenchError(f"study {study.name}: {sweep.stage} {' '.join(overrides)}: {e}".splitlines()[0]) from None
    finally:
        GlobalHydra.instance().clear()
    if not task_config(cfg.get("task")).is_lm:  # a task run's train_len is its longest training sequence
        from .train.configure import fitted  # posbench train's fitting (torch: a task's runs only)

        cfg = fitted(cfg)
    return config_hash(cfg)


def _finished_keys(root: Path, finished_only: bool) -> set[tuple[str, int]]:
    """(config hash, seed) of every run under ``root`` with a results.csv (and, for run dirs, its
    figure, which ``posbench train`` draws last) or a tasks.csv (an algorithmic task's run, which
    writes it when it ends)."""
    keys = set()
    if not root.is_dir():
        return keys
    for results in [*root.rglob("results.csv"), *root.rglob("tasks.csv")]:
        if finished_only and results.name == "results.csv" and not (results.parent / "ppl_vs_length.png").is_file():
            continue
        try:
            rows = pd.read_csv(results, usecols=["config_hash", "seed"])
        except (ValueError, pd.errors.EmptyDataError):
            continue
        keys |= {(str(h), int(s)) for h, s in zip(rows.config_hash, rows.seed)}
    return keys


def finished(run: Path) -> bool:
    """Whether a run dir's run has ended: its figure drawn (the LM ladder) or its tasks.csv written."""
    return (run / "ppl_vs_length.png").is_file() or (run / "tasks.csv").is_file()


def plan(study: Study, only=None, extra: list[str] = ()) -> tuple[list[Sweep], int]:
    """The sweeps still to train or evaluate (each with only its missing seeds), and how many runs
    are done (an eval stage's: :func:`evaluated`)."""
    done = _finished_keys(study.runs, False) | _finished_keys(study.out, True)
    todo, have = [], 0
    for sweep in sweeps(study, only):
        if sweep.pretrained:
            left = pretrained_left(study, sweep, extra)
            have += left is None
            todo += [left] if left is not None else []
            continue
        if sweep.evaluates:
            missing = [seed for seed in sweep.seeds if not evaluated(study, sweep, seed, extra)]
        else:
            digest = sweep_hash(study, sweep, extra)
            missing = [seed for seed in sweep.seeds if digest is None or (digest, seed) not in done]
        have += len(sweep.seeds) - len(missing)
        if missing:
            todo.append(replace(sweep, seeds=tuple(missing)))
    return todo, have


def _pretrained_config(study: Study, sweep: Sweep, extra: list[str] = ()):
    """The ``posbench eval pretrained=...`` config of a pretrained sweep, composed as the command
    would, its model resolved to its file (:func:`posbench.cli.hydra_apps.resolve_pretrained`)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from .cli.hydra_apps import resolve_pretrained

    overrides = pretrained_overrides(study, sweep, extra)
    if study.config_dirs:
        overrides.append("hydra.searchpath=[" + ",".join(f"file://{d}" for d in study.config_dirs) + "]")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            cfg = compose("app_eval", overrides=overrides)
    except Exception as e:  # Hydra's own errors: a bad override in the study file
        raise PosbenchError(f"study {study.name}: {sweep.stage} {' '.join(overrides)}: {e}".splitlines()[0]) from None
    finally:
        GlobalHydra.instance().clear()
    resolve_pretrained(cfg)
    return cfg


def pretrained_overrides(study: Study, sweep: Sweep, extra: list[str] = ()) -> list[str]:
    return [f"pretrained={sweep.pretrained}", f"out='{study.out / sweep.folder}'", *sweep.overrides,
            *eval_extra(extra)]


def pretrained_left(study: Study, sweep: Sweep, extra: list[str] = ()) -> Sweep | None:
    """What a pretrained sweep has left to compute, read with the model's config and tokenizer
    alone (:func:`posbench.eval.subject.open_pretrained` without weights): None when nothing; the
    sweep itself when ladder rows are missing (``posbench eval`` computes only those,
    :func:`posbench.eval.ladder.ladder_plan`); for a probe (``probe=``), the sweep with
    ``probe.lengths`` cut to the lengths whose rows its csv lacks under the method's label and the
    model's config hash (a probe's rows are written when it ends, so each run skips the lengths
    that finished). Rows count where the folder under ``out`` holds them, or its export (an ok
    row of the label, config hash and scored token count at each length)."""
    import contextlib
    import io

    from .eval.ladder import ladder_plan, scored_tokens
    from .eval.probes import build_probe
    from .eval.subject import open_pretrained, scaling_label

    cfg = _pretrained_config(study, sweep, extra)
    export = study.runs / sweep.folder
    with contextlib.redirect_stderr(io.StringIO()):  # the ladder's "already in results.csv" lines
        subject = open_pretrained(cfg, weights=False)
        label, digest = scaling_label(subject.ecfg.rope_scaling, subject.ext), config_hash(subject.rows_config)
        if not cfg.get("probe"):
            lengths = subject.ladder_lengths()
            key = (str(cfg.pretrained), str(cfg.data))  # a 262k-token vocabulary's digest takes seconds: once
            subject.source = _CORPORA[key] = _CORPORA.get(key) or subject.corpus()
            tokens = subject.corpus().splits[subject.ecfg.split]
            n = scored_tokens(tokens, lengths, subject.ecfg.max_tokens, subject.ecfg.split, subject.ecfg)
            todo = ladder_plan(subject, label, lengths, n)
            if not todo.todo and not todo.plain:
                return None
            rows = _rows(export / "results.csv", label, digest)
            exported = set(rows[(rows.status == "ok") & (rows.tokens == n)].eval_len.astype(int))
            return None if set(lengths) <= exported else sweep
    probe = build_probe(cfg.probe)
    have = {int(n) for where in (subject.out, export) for n in _rows(where / f"{probe.name}.csv", label, digest).length}
    missing = [n for n in probe.lengths(subject.train_len) if n not in have]
    if not missing:
        return None
    kept = tuple(o for o in sweep.overrides if o.split("=", 1)[0].lstrip("+") != "probe.lengths")
    return replace(sweep, overrides=(*kept, f"probe.lengths=[{','.join(map(str, missing))}]"))


_CORPORA: dict[tuple[str, str], object] = {}  # (model file, data config) -> its corpus, while a study plans


def _rows(path: Path, label: str, digest: str) -> pd.DataFrame:
    """The rows of a csv of results or a probe under one method ``label`` and config hash."""
    if not path.is_file():
        return pd.DataFrame(columns=["rope_scaling", "config_hash", "status", "tokens", "eval_len", "length"])
    rows = pd.read_csv(path)
    return rows[(rows.rope_scaling == label) & (rows.config_hash.astype(str) == digest)]


def _eval_config(study: Study, sweep: Sweep, run: Path, extra: list[str] = ()):
    """The ``posbench eval checkpoint=<run>`` config of an eval sweep, composed as the command would."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = [f"checkpoint='{run}'", *sweep.overrides, *eval_extra(extra)]
    if study.config_dirs:
        overrides.append("hydra.searchpath=[" + ",".join(f"file://{d}" for d in study.config_dirs) + "]")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            return compose("app_eval", overrides=overrides)
    except Exception as e:  # Hydra's own errors: a bad override in the study file
        raise PosbenchError(f"study {study.name}: {sweep.stage} {' '.join(overrides)}: {e}".splitlines()[0]) from None
    finally:
        GlobalHydra.instance().clear()


def eval_extra(extra: list[str]) -> list[str]:
    """The ``--extra`` overrides ``posbench eval`` takes (device=, eval.*); train.* are training's."""
    return [o for o in extra if o.split("=", 1)[0].lstrip("+").split(".")[0] in EVAL_EXTRA]


EVAL_EXTRA = ("device", "eval", "precision")


def evaluated(study: Study, sweep: Sweep, seed: int, extra: list[str] = ()) -> bool:
    """Whether an eval sweep's run ``seed`` holds its rows: in its run dir, where ``posbench eval``
    would compute no length (:func:`posbench.eval.ladder.ladder_plan`, which keeps the rows of
    results.csv with the evaluation's key, config hash, scored token count and per-token NLL:
    ``existing_rows``); where only its export is left (no checkpoint to evaluate), where the
    export's results.csv has an ok row of the run's config hash at every length under the
    evaluation's key (:func:`posbench.eval.ladder.evaluation_rows`)."""
    import contextlib
    import io

    from omegaconf import OmegaConf

    from .config import EvalConfig, typed
    from .eval.ladder import evaluation_rows, ladder_plan, scored_tokens
    from .eval.probe import Subject
    from .eval.subject import extension_of, open_subject, scaling_label

    run, export_dir = study.out / sweep.folder / f"seed={seed}", study.runs / sweep.folder / f"seed={seed}"
    cfg = _eval_config(study, sweep, run, extra)
    if cfg.get("probe"):
        return _probed(cfg, run, export_dir)
    if (run / "config.yaml").is_file() and (run / "checkpoints" / "last.pt").is_file():
        with contextlib.redirect_stderr(io.StringIO()):  # the ladder's "already in results.csv" lines
            subject = open_subject(cfg)
            lengths = subject.ladder_lengths()
            tokens = subject.corpus().splits[subject.ecfg.split]
            n = scored_tokens(tokens, lengths, subject.ecfg.max_tokens, subject.ecfg.split, subject.ecfg)
            todo = ladder_plan(subject, scaling_label(subject.ecfg.rope_scaling, subject.ext), lengths, n)
        return not todo.todo and not todo.plain
    if not (export_dir / "results.csv").is_file() or not (export_dir / "config.yaml").is_file():
        return False
    train_cfg = OmegaConf.load(export_dir / "config.yaml")
    ecfg = typed(EvalConfig, cfg.eval, "eval")
    train_len = int(train_cfg.train.train_len)
    ext = extension_of(ecfg, train_len)
    lengths = ecfg.resolve_lengths(train_len)
    subject = Subject(None, None, None, None, train_len, ecfg=ecfg, ext=ext, rows_config=train_cfg, out=export_dir)
    rows = evaluation_rows(subject, scaling_label(ecfg.rope_scaling, ext), lengths)
    rows = rows[(rows.status == "ok") & (rows.config_hash.astype(str) == config_hash(train_cfg))]
    return set(lengths) <= set(rows.eval_len)


def _probed(cfg, run: Path, export_dir: Path) -> bool:
    """Whether a probe's csv (``probe=``) in the run dir or its export holds rows of the run's
    config hash under the evaluation's label at every length the probe runs (its rows are written
    when it ends; a probe cut off is run again whole)."""
    from omegaconf import OmegaConf

    from .config import EvalConfig, typed
    from .eval.probes import build_probe
    from .eval.subject import extension_of, scaling_label

    where = next((d for d in (run, export_dir) if (d / "config.yaml").is_file()), None)
    if where is None:
        return False
    train_cfg = OmegaConf.load(where / "config.yaml")
    ecfg, train_len = typed(EvalConfig, cfg.eval, "eval"), int(train_cfg.train.train_len)
    label, digest = scaling_label(ecfg.rope_scaling, extension_of(ecfg, train_len)), config_hash(train_cfg)
    probe = build_probe(cfg.probe)
    have = {int(n) for d in (run, export_dir) for n in _rows(d / f"{probe.name}.csv", label, digest).length}
    return set(probe.lengths(train_len)) <= have


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
    from .report.baselines import export_baseline

    if sweep.pretrained:
        return export_pretrained(study, sweep)
    written = []
    sweep_dir = study.out / sweep.folder
    for seed in sweep.seeds:
        run = sweep_dir / f"seed={seed}"
        dest = study.runs / sweep.folder / run.name
        if not finished(run):
            continue
        if (run / "tasks.csv").is_file():  # a task run: its rows and config are all the report reads
            written += _export_task(run, dest, study.runs / ".export")
            continue
        if (dest / "blocks.npz").is_file() and not (sweep.evaluates and _gained_rows(run, dest)):
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


def export_pretrained(study: Study, sweep: Sweep) -> list[Path]:
    """A pretrained folder exported to ``runs/<folder>`` where its files changed since: results.csv,
    positions.csv and config.yaml with the per-block sums the report's intervals need (as a
    trained run's, :func:`posbench.report.baselines.export_baseline`), and every probe's csv with
    probes.json. -> [the export] when written."""
    import shutil

    from .report.baselines import export_baseline

    run, dest, tmp = study.out / sweep.folder, study.runs / sweep.folder, study.runs / ".export"
    files = [p for p in run.glob("*") if p.suffix in (".csv", ".json", ".yaml")] if run.is_dir() else []
    if not files or (dest.is_dir() and max(p.stat().st_mtime for p in files) <= dest.stat().st_mtime):
        return []
    _remove_tree(tmp)
    if (run / "results.csv").is_file():
        made = export_baseline([run], tmp)[0]
    else:  # probes alone
        made = tmp / "probes"
        made.mkdir(parents=True)
        shutil.copyfile(run / "config.yaml", made / "config.yaml")
    for path in files:
        if path.name not in ("results.csv", "positions.csv", "config.yaml"):
            shutil.copyfile(path, made / path.name)
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
    is where the earlier rows live. Each csv is merged by its key (the new rows win), and the
    per-block sums of the kept result rows go with them."""
    import numpy as np

    from .eval.results import KEY, merge_csv
    from .eval.token_nll import row_key
    from .report.baselines import BLOCKS_FILE

    for path in old.glob("*.csv"):
        mine = pd.read_csv(path)
        theirs = pd.read_csv(new / path.name) if (new / path.name).is_file() else mine.iloc[:0]
        key = [c for c in mine.columns if c in KEY or c in ("depth", "bin_start", "length")]
        merged = merge_csv(new / path.name, theirs, key, old=mine)
        if path.name == "results.csv" and (old / BLOCKS_FILE).is_file():
            blocks = dict(np.load(old / BLOCKS_FILE))
            if (new / BLOCKS_FILE).is_file():
                blocks.update(dict(np.load(new / BLOCKS_FILE)))
            keys = {row_key(r) for r in merged.to_dict("records")}
            np.savez(new / BLOCKS_FILE, **{k: v for k, v in sorted(blocks.items()) if k in keys})


def _export_task(run: Path, dest: Path, tmp: Path) -> list[Path]:
    """An algorithmic task's run exported once: its tasks.csv and config.yaml (no per-token NLL)."""
    import shutil

    if (dest / "tasks.csv").is_file():
        return []
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

    from .eval.probes import probe_files

    for name in probe_files(run):
        shutil.copyfile(run / f"{name}.csv", dest / f"{name}.csv")
    if (run / "probes.json").is_file():
        shutil.copyfile(run / "probes.json", dest / "probes.json")


def _gained_rows(run: Path, dest: Path) -> bool:
    """Whether the run's results.csv holds a row (by its key and config hash) its export's lacks,
    or a probe's csv holds rows its export's does not."""
    from .eval.probes import probe_files

    for name in probe_files(run):
        theirs = dest / f"{name}.csv"
        if not theirs.is_file() or len(pd.read_csv(theirs)) < len(pd.read_csv(run / f"{name}.csv")):
            return True
    from .eval.token_nll import row_key

    def keys(path: Path) -> set:
        if not path.is_file():
            return set()
        return {(row_key(r), str(r["config_hash"])) for r in pd.read_csv(path).to_dict("records")}

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


def train(study: Study, todo: list[Sweep], jobs: int, extra: list[str] = ()) -> list[str]:
    """Run the sweeps side by side, at most ``jobs`` runs at once; export each run within
    ``EXPORT_EVERY`` seconds of its end (a sweep whose seeds run one after another keeps its
    first seed's run even when the study is cut off before the last), and each sweep as it ends.
    -> the sweeps that failed (their logs' paths)."""
    waiting, running, failed, dead = list(todo), [], [], set()
    last_export = time.monotonic()
    while waiting or running:
        busy = sum(min(jobs, len(s.seeds)) for s, _, _ in running)
        for sweep in [w for w in waiting if w.parent in dead]:
            waiting.remove(sweep)  # its parent failed: nothing to start from
            dead.add(sweep.folder)
            failed.append(f"{log_path(study, sweep)} (not started: {sweep.parent} failed)")
        ready = [w for w in waiting if not _pending(w, waiting, running)]
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
                proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
            running.append((sweep, proc, log))
            busy += min(jobs, len(sweep.seeds))
        time.sleep(1.0)
        if time.monotonic() - last_export >= EXPORT_EVERY:  # a sweep's seeds run one after another
            last_export = time.monotonic()
            for sweep, _, _ in running:
                for dest in export(study, sweep):
                    print(f"study {study.name}: exported {dest}", flush=True)
        for item in [r for r in running if r[1].poll() is not None]:
            running.remove(item)
            sweep, proc, log = item
            written = export(study, sweep)
            state = "done" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
            print(f"study {study.name}: {sweep.stage} {sweep.name} {state}; exported {len(written)} run(s)", flush=True)
            if proc.returncode != 0:
                failed.append(str(log))
                if not (sweep.evaluates or sweep.pretrained):  # else the runs are fine: their other evaluations go on
                    dead.add(sweep.folder)
    return failed


def report_command(study: Study) -> list[str]:
    rep = study.report
    by = [f"--by={k}" for k in rep.get("by") or []]
    contrasts = [f"--contrast={a}/{b}" for a, b in rep.get("contrasts") or []]
    return [*_posbench(), "report", *map(str, rep.get("dirs") or []), str(study.runs), "--out", str(study.results),
            *by, *contrasts, *map(str, rep.get("args") or [])]


def report(study: Study) -> None:
    """``posbench report`` on the exported runs (and ``dirs`` beside them), then each of ``tables``."""
    subprocess.run(report_command(study), check=True)
    for name, script in (study.report.get("tables") or {}).items():
        with open(study.results / name, "w") as f:
            subprocess.run([sys.executable, str(script), str(study.results / "report.csv")], stdout=f, check=True)


def main(args: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="posbench study", description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", help="the study (conf/study/<name>.yaml); none: list the studies")
    parser.add_argument("--config-dir", action="append", default=[], metavar="DIR",
                        help="a dir with study/<name>.yaml files (and the configs its runs use); repeatable")
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side (default 2: two CPU cores)")
    parser.add_argument("--only", default=None, metavar="STAGES", help="comma-separated stages to train (default: all)")
    parser.add_argument("--step", default="all", choices=["all", "plan", "train", "export", "report"],
                        help="plan: list what would train; train: train (and export) without the report; "
                             "export: export finished runs; report: draw the exported runs")
    parser.add_argument("--extra", action="append", default=[], metavar="OVERRIDE",
                        help="an override added to every run that keeps its hash (train.compile=false, device=cuda)")
    ns = parser.parse_args(args)
    dirs = [Path(d) for d in ns.config_dir]
    if ns.name is None:
        for name, path in study_files(dirs).items():
            desc = (yaml.safe_load(path.read_text()) or {}).get("description", "")
            print(f"{name:<16} {desc}")
        return
    if ns.jobs < 1:
        raise PosbenchError(f"study: --jobs {ns.jobs} is not valid; valid: a count of runs >= 1")
    study = load_study(ns.name, dirs)
    only = [s for s in ns.only.split(",") if s] if ns.only else None
    study.config_dirs = [d.resolve() for d in dirs]
    if ns.step in ("all", "plan", "train"):
        todo, have = plan(study, only, ns.extra)
        total = have + sum(len(s.seeds) for s in todo)
        evals = sum(len(s.seeds) for s in todo if s.evaluates or s.pretrained)
        print(f"study {study.name}: {have} of {total} runs done; {total - have - evals} to train"
              + (f", {evals} to evaluate" if evals else ""))
        if ns.step == "plan":
            for s in todo:
                print("  " + shlex.join(command(study, s, ns.jobs, ns.extra)))
            return
        failed = train(study, todo, ns.jobs, ns.extra)
        if failed:
            raise PosbenchError(f"study {study.name}: {len(failed)} sweep(s) failed; their logs: {', '.join(failed)}")
    if ns.step == "export":
        n = sum(len(export(study, s)) for s in sweeps(study, only))
        print(f"study {study.name}: exported {n} run(s) to {study.runs}")
    if ns.step in ("all", "report"):
        if not _finished_keys(study.runs, False):
            raise PosbenchError(f"study {study.name}: no exported runs under {study.runs} to report yet")
        report(study)
