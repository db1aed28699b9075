"""``posbench train`` and ``posbench eval``: the two Hydra apps, one module for both.

They share what sets a Hydra app apart from the other commands: the checks of the command line
before Hydra composes it (:mod:`.validate`), the help templates' ``choices`` resolver, the
failure policy of a run or a sweep job (:mod:`.failures`), the torch threads of a job, and
:func:`run_hydra`, which starts either. Each task only unpacks the config and calls its stage:
for ``train`` the run config built once (:func:`posbench.train.configure.train_config`), then
:func:`posbench.train.loop.train`, or for ``eval`` the one evaluation of a trained run or a
pretrained model (:func:`posbench.eval.subject.open_subject`, then
:func:`posbench.eval.ladder.evaluate_subject` or :func:`posbench.eval.probes.probe_subject`),
then draws the run's figures.
"""

from __future__ import annotations

import os
import sys
from contextlib import nullcontext
from pathlib import Path

from ..config import conf_dir, resolve_pretrained
from ..errors import SWEEP_FAILURES, fail
from .failures import user_errors
from .validate import (
    check_app_groups,
    check_encoding_options,
    check_group_choices,
    check_hydra_flags,
    fill_choice_names,
    group_choices,
    hydra_error,
    store_plugin_configs,
    user_config_dirs,
)

HYDRA_APPS = {"train": "app_train", "eval": "app_eval"}  # command -> its config in conf/
HELP = {"train": "train a model with one encoding on short windows, then evaluate it at growing lengths",
        "eval": "evaluate a trained run (checkpoint=<run dir>) at any lengths, without retraining"}


def _rank() -> int:
    """This process's rank under torchrun / Slurm tasks (0 when alone)."""
    from ..runs.distributed import world

    return world().rank


def _use_threads() -> None:
    """Torch threads for this job (:mod:`posbench.runs.threads`): the cores other processes leave
    idle, re-checked as the job runs; jobs run side by side by a local parallel launcher (joblib)
    split the cores between them (cores / n_jobs at most each)."""
    from hydra.core.hydra_config import HydraConfig

    from ..runs import threads

    cap = None
    launcher = HydraConfig.get().launcher if HydraConfig.initialized() else {}
    if "joblib" in str(launcher.get("_target_", "")):
        cores = len(threads.allowed_cores())
        n_jobs = int(launcher.get("n_jobs") or 1)
        n_jobs = cores if n_jobs < 0 else n_jobs  # joblib: -1 = one job per core
        cap = max(1, cores // n_jobs)
    threads.activate(cap)


def _train_task(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig

    from ..report.build import draw_run
    from ..runs.lock import hold
    from ..runs.output import tee_to
    from ..train.configure import train_config
    from ..train.loop import train

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    _use_threads()
    log = tee_to(run_dir / "train.log") if _rank() == 0 else nullcontext()  # what the run prints, kept
    with log, user_errors(run_dir), hold(run_dir, "train"):  # one train per run dir
        fill_choice_names(cfg)  # a sweep job's (a single run's were filled before its run dir existed)
        check_encoding_options(cfg)  # a sweep job's (a single run's was checked before its run dir existed)
        finished = train(train_config(cfg), run_dir)
        if finished.rows is None:  # not rank 0: rank 0 evaluates and reports
            return
        (run_dir / "FAILED").unlink(missing_ok=True)  # an earlier attempt's failure is over
        draw_run(run_dir)
        print(finished.summary)
        print(f"\nrun dir: {run_dir}  ({finished.files})")


def _eval_lock(cfg):
    """Evaluations of a run may overlap (their merges are serialised), a training of it may not."""
    from ..runs.lock import hold
    from ..runs.rundir import RunDir

    if cfg.get("pretrained") or not cfg.get("checkpoint"):
        return nullcontext()  # a pretrained model's folder has no training; open_subject names what is missing
    return hold(RunDir.existing(cfg.checkpoint).path, "eval", shared=True)


def _check_subject(cfg) -> None:
    """One model named: ``pretrained=`` resolved to its path, a ``checkpoint=`` a language model's run."""
    from omegaconf import OmegaConf

    from ..runs.rundir import RunDir
    from ..train.workload import check_later_evaluation

    if cfg.get("pretrained"):
        if cfg.get("checkpoint"):
            fail(f"checkpoint={cfg.checkpoint} and pretrained={cfg.pretrained} both name a model; valid: one of them")
        resolve_pretrained(cfg)
    elif cfg.get("checkpoint"):
        check_later_evaluation(OmegaConf.load(RunDir.existing(cfg.checkpoint).config), cfg.checkpoint)


def _eval_task(cfg) -> None:
    """``posbench eval``: a trained run (``checkpoint=``) or a pretrained model (``pretrained=``)
    opened once as a subject (:mod:`posbench.eval.subject`), then its ladder or ``probe=``."""
    from ..config import code_version
    from ..eval.ladder import evaluate_subject
    from ..eval.probes import build_probe, probe_subject
    from ..eval.results import markdown_results
    from ..eval.subject import apply_method, open_subject
    from ..report.build import draw_run

    code_version()  # read now, as the code is imported: rows written an hour on name this code, not the checkout's then
    _use_threads()
    fill_choice_names(cfg, ("probe",))
    with user_errors(None), _eval_lock(cfg):
        apply_method(cfg)  # method=NAME method.OPTION=V: the eval.extension keys every later step reads
        _check_subject(cfg)
        probe = build_probe(cfg.probe) if cfg.get("probe") else None
        subject = open_subject(cfg)
        if probe is not None:
            rows = probe_subject(subject, probe, cfg.probe)
            draw_run(subject.out)
            print(probe.markdown(rows))
            print(f"\nresults merged into {subject.out / f'{probe.name}.csv'} ({probe.name}.png)")
            return
        rows = evaluate_subject(subject)
        draw_run(subject.out)
        print(markdown_results(rows))
        print(f"\nresults in {subject.out / 'results.csv'} (binned loss by position: positions.csv)")


def model_shape(name: str, path: Path | None) -> tuple[str, int, str]:
    """What ``model=NAME`` means, from its YAML -> (name, non-embedding parameters, ``4 layers x
    d_model 256, 3.1M non-embedding parameters``): those of the blocks' attention and MLP
    matrices, 4 d^2 + 2 d d_ff a layer; the embedding, which the vocabulary sizes, comes on top."""
    from omegaconf import OmegaConf

    try:
        m = OmegaConf.load(path)
        d, layers, ff = int(m.d_model), int(m.n_layers), int(m.d_ff)
    except Exception:  # a config dir's file that says less: its name alone
        return name, 0, ""
    params = layers * (4 * d * d + 2 * d * ff)
    size = f"{params / 1e6:.1f}M" if params >= 1e6 else f"{params / 1e3:.0f}k"
    return name, params, f"{layers:>2} layers x d_model {d:<4}  {size:>6} non-embedding parameters"


def choices_text(args: list[str]):
    """The ``choices`` resolver of the help templates (``conf/app_*.yaml``): a group's choices,
    counting user config dirs and installed encodings, wrapped under the template's 16-column labels."""
    import textwrap

    def choices(group: str) -> str:
        found = group_choices(group, user_config_dirs(args))
        if group == "model":  # one a line, smallest first, with its shape
            from omegaconf import OmegaConf

            defaults = OmegaConf.to_container(OmegaConf.load(conf_dir() / "app_train.yaml").defaults)
            default = next((d["model"] for d in defaults if isinstance(d, dict) and "model" in d), None)
            shapes = sorted((model_shape(name, path) for name, path in found.items()), key=lambda s: (s[1], s[0]))
            width = max(len(name) for name, _, _ in shapes)
            return f"\n{' ' * 16}".join(f"{name:<{width}}  {text}{' (the default)' if name == default else ''}".rstrip()
                                         for name, _, text in shapes)
        names = ", ".join(sorted(found))
        return textwrap.fill(names, width=100, initial_indent=" " * 16, subsequent_indent=" " * 16).lstrip()

    return choices


def run_hydra(command: str, args: list[str]) -> None:
    import hydra
    from omegaconf import OmegaConf

    from ..config import run_name

    OmegaConf.register_new_resolver("run_name", run_name, replace=True)
    args = check_hydra_flags(command, args)
    OmegaConf.register_new_resolver("choices", choices_text(args), replace=True)
    if "--help" not in args and "-h" not in args:
        check_app_groups(command, args)
        asked = check_group_choices(args, user_config_dirs(args))
        store_plugin_configs(asked)
    task = {"train": _train_task, "eval": _eval_task}[command]
    if command == "train" and _rank() > 0:  # one set of Hydra files and logs: rank 0's
        args = args + ["hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    sys.argv = [f"posbench {command}"] + args
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra's errors reach us (one line below); bugs keep their traceback
    from hydra.errors import HydraException

    try:
        hydra.main(config_path=str(conf_dir()), config_name=HYDRA_APPS[command], version_base=None)(task)()
    except HydraException as e:
        fail(hydra_error(e, args))
    if SWEEP_FAILURES:
        fail(f"{len(SWEEP_FAILURES)} job(s) failed:\n  " + "\n  ".join(SWEEP_FAILURES), code=1)


def train_command(args: list[str]) -> None:
    run_hydra("train", args)


def eval_command(args: list[str]) -> None:
    run_hydra("eval", args)
