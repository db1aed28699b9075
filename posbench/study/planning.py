"""What a study has left to train or evaluate, composed and read without running anything: a
sweep's config hash as ``posbench train`` composes it, the runs finished under ``out`` or exported
under ``runs``, the rows an eval stage's runs hold (:func:`evaluated`) and what a pretrained
stage's model lacks (:func:`pretrained_left`, read without its weights)."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import pandas as pd

from ..config import conf_dir, config_hash, resolve_pretrained, task_config
from ..errors import PosbenchError
from .spec import Study, Sweep, override_key, restrict, sweeps


def sweep_hash(study: Study, sweep: Sweep, extra: list[str] = ()) -> str | None:
    """The config hash of a sweep's runs, composed as ``posbench train`` composes it, once for all
    its seeds (the hash leaves the seed out: ``config.NOT_HASHED``); None when the hash depends on
    a run not yet trained (``train.init_from``)."""
    overrides = [*study.common, *sweep.overrides, *extra]
    if any(override_key(o) == "train.init_from" for o in overrides):
        return None
    cfg = _compose(study, sweep, "app_train", overrides)
    if not task_config(cfg.get("task")).is_lm:  # a task run's train_len is its longest training sequence
        from ..train.configure import fitted  # posbench train's fitting (torch: a task's runs only)

        cfg = fitted(cfg)
    return config_hash(cfg)


def _compose(study: Study, sweep: Sweep, app: str, overrides: list[str]):
    """``app`` (app_train, app_eval) composed with ``overrides`` as the command would compose it,
    the study's config dirs searched; a bad override in the study file is one line."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = list(overrides)
    if study.config_dirs:
        overrides.append("hydra.searchpath=[" + ",".join(f"file://{d}" for d in study.config_dirs) + "]")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            cfg = compose(app, overrides=overrides)
    except Exception as e:  # Hydra's own errors: a bad override in the study file
        raise PosbenchError(f"study {study.name}: {sweep.stage} {' '.join(overrides)}: {e}".splitlines()[0]) from None
    finally:
        GlobalHydra.instance().clear()
    if app == "app_eval":  # method=NAME method.OPTION=V, as posbench eval reads it
        from ..eval.subject import apply_method

        try:
            apply_method(cfg)
        except PosbenchError as e:
            raise PosbenchError(f"study {study.name}: {sweep.stage}: {e}") from None
    return cfg


def _finished_keys(root: Path, finished_only: bool) -> set[tuple[str, int]]:
    """(config hash, seed) of every run under ``root`` with a results.csv (and, for run dirs, its
    figure, which ``posbench train`` draws last) or a tasks.csv (an algorithmic task's run, which
    writes it when it ends)."""
    from ..eval.results import read_table

    keys = set()
    if not root.is_dir():
        return keys
    for results in [*root.rglob("results.csv"), *root.rglob("tasks.csv")]:
        if finished_only and results.name == "results.csv" and not (results.parent / "ppl_vs_length.png").is_file():
            continue
        try:
            rows = read_table(results, usecols=["config_hash", "seed"])
        except (ValueError, pd.errors.EmptyDataError):
            continue
        keys |= {(str(h), int(s)) for h, s in zip(rows.config_hash, rows.seed)}
    return keys


def finished(run: Path) -> bool:
    """Whether a run dir's run has ended: its figure drawn (the LM ladder) or its tasks.csv written."""
    return (run / "ppl_vs_length.png").is_file() or (run / "tasks.csv").is_file()


def plan(study: Study, only=None, extra: list[str] = (), where: dict[str, set[str]] | None = None
         ) -> tuple[list[Sweep], int]:
    """The sweeps still to train or evaluate (each with only its missing seeds), and how many runs
    are done (an eval stage's: :func:`evaluated`), of the stages ``only`` names and the runs
    ``where`` picks (:func:`posbench.study.spec.restrict`; all by default)."""
    done = _finished_keys(study.runs, False) | _finished_keys(study.out, True)
    _EVAL_CONFIGS.clear()  # the study files as they are now
    todo, have = [], 0
    for sweep in restrict(study, sweeps(study, only), where or {}):
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


def unreported(study: Study, extra: list[str] = ()) -> tuple[list[str], int]:
    """The planned runs of every stage that a report of the study's exports would lack, and how
    many runs it plans: a trained run without an export of its config hash and seed; a branch run
    whose hash cannot be known here (its parent trained on another machine, :func:`orphaned`)
    without an export in its folder; a pretrained model's sweep without its results.csv; an eval
    run without its rows (:func:`evaluated`). Read from ``runs`` alone, so a report is judged by
    what it draws. -> their folders (``rope/seed=1``, a pretrained sweep's folder), and the count."""
    exported = _finished_keys(study.runs, False)
    missing, total = [], 0
    for sweep in sweeps(study, None):
        if sweep.pretrained:
            total += 1
            if not (study.runs / sweep.folder / "results.csv").is_file():
                missing.append(sweep.folder)
            continue
        digest = None if sweep.evaluates else sweep_hash(study, sweep, extra)
        for seed in sweep.seeds:
            total += 1
            if sweep.evaluates:
                done = evaluated(study, sweep, seed, extra)
            elif digest is None:
                done = (study.runs / sweep.folder / f"seed={seed}" / "results.csv").is_file()
            else:
                done = (digest, seed) in exported
            if not done:
                missing.append(f"{sweep.folder}/seed={seed}")
    return missing, total


def orphaned(study: Study, todo: list[Sweep]) -> tuple[list[Sweep], list[str]]:
    """Branch runs that cannot start: a ``from:`` stage's seed whose parent run is done (exported)
    but whose run dir, with the checkpoints the branch starts from, is not under ``out`` (it trained
    on another machine), or whose parent has not trained and is not in the todo (``--only`` or
    ``--where`` left it out). -> the todo without them, and one line per (parent, seed): the exports
    whose removal trains the seed whole again, parent and branches from one run, or the choice
    that would include the parent."""
    training = {(s.folder, seed) for s in todo if not s.evaluates for seed in s.seeds}
    keep, lost = [], {}
    for sweep in todo:
        if not sweep.parent or sweep.evaluates or sweep.pretrained:
            keep.append(sweep)
            continue
        gone = [seed for seed in sweep.seeds if (sweep.parent, seed) not in training
                and not (study.out / sweep.parent / f"seed={seed}" / "config.yaml").is_file()]
        for seed in gone:
            lost.setdefault((sweep.parent, seed), []).append(sweep.stage)
        left = tuple(seed for seed in sweep.seeds if seed not in gone)
        keep += [replace(sweep, seeds=left)] if left else []
    lines, every = [], sweeps(study) if lost else []
    for (parent, seed), stages in sorted(lost.items()):
        if not (study.runs / parent / f"seed={seed}").is_dir():  # not trained anywhere: left out by the choice
            stage = next(s.stage for s in every if s.folder == parent)
            lines.append(f"{', '.join(stages)} of {parent} seed={seed} cannot start: its parent run has not trained "
                         f"and is not among the runs chosen; valid: add its stage {stage} to --only, or widen "
                         "--where to it")
            continue
        family = [s.folder for s in every if s.folder == parent or s.parent == parent]
        exported = [str(study.runs / f / f"seed={seed}") for f in dict.fromkeys(family)
                    if (study.runs / f / f"seed={seed}").is_dir()]
        why = (f"{', '.join(stages)} of {parent} seed={seed} cannot start: its parent's run "
               f"{study.out / parent / f'seed={seed}'} is not here (its export is), and a branch starts from "
               "that run's checkpoints")
        if shipped(study.runs):  # the exports are the project's own files: never advise removing them
            lines.append(f"{why}; the project ships its runs' exports, not their checkpoints; to train the seed "
                         f"whole, copy the study file into DIR/study/ with out:, runs: and results: naming new folders "
                         f"and run posbench study --config-dir DIR {study.name}")
        else:
            lines.append(f"{why}; to train the seed whole, remove {' '.join(exported)}")
    return keep, lines


def shipped(path: Path) -> bool:
    """Whether ``path`` lies in the project's shipped results (``results/`` of the source checkout
    posbench runs from), files that the project tracks, not a user's outputs."""
    results = Path(__file__).resolve().parents[2] / "results"
    return results.is_dir() and Path(path).resolve().is_relative_to(results.resolve())


def seed_major(todo: list[Sweep]) -> list[Sweep]:
    """The sweeps split into one sweep per seed, ordered by seed first: every line's first seed
    trains before any line's second (stages keep their order within a seed), so a study cut off
    early (a GPU slot's end) holds one seed of every line rather than every seed of a few. An eval
    stage splits the same way (each part evaluates its parent's run of that seed); a pretrained
    sweep, which has no seeds, keeps its place among the first seed's sweeps."""
    split = [(seed, i, replace(s, seeds=(seed,))) for i, s in enumerate(todo) if not s.pretrained for seed in s.seeds]
    whole = [(min(s.seeds, default=0), i, s) for i, s in enumerate(todo) if s.pretrained]
    return [s for _, _, s in sorted(split + whole, key=lambda t: (t[0], t[1]))]


def _pretrained_config(study: Study, sweep: Sweep, extra: list[str] = ()):
    """The ``posbench eval pretrained=...`` config of a pretrained sweep, composed as the command
    would, its model resolved to its file (:func:`posbench.config.resolve_pretrained`)."""
    cfg = _compose(study, sweep, "app_eval", pretrained_overrides(study, sweep, extra))
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
    row of the label, config hash, scored token count, mode and stride at each length)."""
    import contextlib
    import io

    from ..eval.probes import build_probe
    from ..eval.subject import open_pretrained, scaling_label

    cfg = _pretrained_config(study, sweep, extra)
    export = study.runs / sweep.folder
    with contextlib.redirect_stderr(io.StringIO()):  # the ladder's "already in results.csv" lines
        subject = open_pretrained(cfg, weights=False)
        label, digest = scaling_label(subject.ecfg.rope_scaling, subject.ext), config_hash(subject.rows_config)
        if not cfg.get("probe"):
            key = (str(cfg.pretrained), str(cfg.data))  # a 262k-token vocabulary's digest takes seconds: once
            subject.source = _CORPORA[key] = _CORPORA.get(key) or subject.corpus()
            lengths, n, done = _ladder_done(subject, label)
            if done:
                return None
            rows = _rows(export / "results.csv", label, digest)
            rows = rows[(rows.status == "ok") & (rows.tokens == n) & (rows["mode"] == subject.ecfg.mode)]
            exported = {(int(r.eval_len), int(r.stride)) for r in rows.itertuples()}
            return None if set(subject.ecfg.strides(lengths).items()) <= exported else sweep
    probe = build_probe(cfg.probe)
    have = {int(n) for where in (subject.out, export) for n in _rows(where / f"{probe.name}.csv", label, digest).length}
    missing = [n for n in probe.lengths(subject.train_len) if n not in have]
    if not missing:
        return None
    kept = tuple(o for o in sweep.overrides if override_key(o) != "probe.lengths")
    return replace(sweep, overrides=(*kept, f"probe.lengths=[{','.join(map(str, missing))}]"))


def _ladder_done(subject, label: str) -> tuple[list[int], int, bool]:
    """A subject's ladder lengths, its scored token count, and whether ``posbench eval`` would
    write no row: it computes none of them and every length the method leaves as trained already
    has its row under the method's name (:func:`posbench.eval.ladder.ladder_plan`: a length in
    ``same`` lacks it, even where the unscaled row it copies is stored)."""
    from ..eval.ladder import ladder_plan
    from ..eval.token_set import scored_count
    from ..runs.rundir import RunDir

    lengths = subject.ladder_lengths()
    tokens = subject.corpus().splits[subject.ecfg.split]
    n = scored_count(RunDir(subject.out).results, tokens, lengths, subject.ecfg, label, subject.budget_given)
    todo = ladder_plan(subject, label, lengths, n)
    return lengths, n, not todo.todo and not todo.same


_CORPORA: dict[tuple[str, str], object] = {}  # (model file, data config) -> its corpus, while a study plans


def _rows(path: Path, label: str, digest: str) -> pd.DataFrame:
    """The rows of a csv of results or a probe under one method ``label`` and config hash."""
    from ..eval.results import read_table

    if not path.is_file():
        return pd.DataFrame(columns=["rope_scaling", "config_hash", "status", "tokens", "eval_len", "length", "mode",
                                     "stride"])
    rows = read_table(path)
    return rows[(rows.rope_scaling == label) & (rows.config_hash == digest)]


def _eval_config(study: Study, sweep: Sweep, run: Path, extra: list[str] = ()):
    """The ``posbench eval checkpoint=<run>`` config of an eval sweep, composed as the command would:
    once per sweep while a study plans (:data:`_EVAL_CONFIGS`; a Hydra composition is most of a
    plan's time, about 0.15 s each), each seed's run set on a copy (no key of the config reads
    ``checkpoint``)."""
    key = (study.name, tuple(map(str, study.config_dirs)), sweep.overrides, tuple(eval_extra(extra)))
    if key not in _EVAL_CONFIGS:
        _EVAL_CONFIGS[key] = _compose(study, sweep, "app_eval", [*sweep.overrides, *eval_extra(extra)])
    cfg = copy.deepcopy(_EVAL_CONFIGS[key])
    cfg.checkpoint = str(run)
    return cfg


_EVAL_CONFIGS: dict[tuple, object] = {}  # an eval sweep's composed config, while a study plans (plan() empties it)


def eval_extra(extra: list[str]) -> list[str]:
    """The ``--extra`` overrides ``posbench eval`` takes (device=, eval.*); train.* are training's."""
    return [o for o in extra if override_key(o).split(".")[0] in EVAL_EXTRA]


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

    from ..config import EvalConfig, typed
    from ..eval.ladder import evaluation_rows
    from ..eval.probe import Subject
    from ..eval.subject import extension_of, open_subject, scaling_label

    run, export_dir = study.out / sweep.folder / f"seed={seed}", study.runs / sweep.folder / f"seed={seed}"
    cfg = _eval_config(study, sweep, run, extra)
    if cfg.get("probe"):
        return _probed(cfg, run, export_dir)
    if (run / "config.yaml").is_file() and (run / "checkpoints" / "last.pt").is_file():
        with contextlib.redirect_stderr(io.StringIO()):  # the ladder's "already in results.csv" lines
            subject = open_subject(cfg)
            return _ladder_done(subject, scaling_label(subject.ecfg.rope_scaling, subject.ext))[2]
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

    from ..config import EvalConfig, typed
    from ..eval.probes import build_probe
    from ..eval.subject import extension_of, scaling_label

    where = next((d for d in (run, export_dir) if (d / "config.yaml").is_file()), None)
    if where is None:
        return False
    train_cfg = OmegaConf.load(where / "config.yaml")
    ecfg, train_len = typed(EvalConfig, cfg.eval, "eval"), int(train_cfg.train.train_len)
    label, digest = scaling_label(ecfg.rope_scaling, extension_of(ecfg, train_len)), config_hash(train_cfg)
    probe = build_probe(cfg.probe)
    have = {int(n) for d in (run, export_dir) for n in _rows(d / f"{probe.name}.csv", label, digest).length}
    return set(probe.lengths(train_len)) <= have
