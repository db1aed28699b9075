"""`posbench <command> [overrides]`: one console script, Hydra apps for train and eval.

    posbench train encoding=alibi                  # one run
    posbench -m train encoding=alibi,rope seed=0,1 # a sweep (also: posbench train -m ...)
    posbench eval checkpoint=outputs/train/alibi/default eval.lengths=[128,4096]
    posbench report multirun/2026-01-01_00-00-00   # one table + one figure
    posbench encodings                             # what can go in encoding=

Group choices (encoding=, model=, data=, ...) are checked before Hydra starts, so a
typo gets one line naming the valid choices. Errors the user can fix are printed as
``posbench: error: ...`` with exit status 2 and leave no files behind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import traceback
from contextlib import contextmanager, nullcontext
from pathlib import Path

from .config import conf_dir
from .errors import SWEEP_FAILURES, PosbenchError, fail
from .runs.lock import RunDirBusy

HYDRA_APPS = {"train": "app_train", "eval": "app_eval"}
COMMANDS = {
    "train": "train a model with one encoding on short windows, then evaluate it at growing lengths",
    "eval": "evaluate a trained run (checkpoint=<run dir>) at any lengths, without retraining",
    "report": "gather results.csv (and tasks.csv) files under run/sweep dirs into tables and figures",
    "encodings": "list the available position encodings (built-in and plugins)",
    "check": "run the conformance checks on an encoding (a name or pkg.module:Class), as the zoo's tests do",
    "convert": "rewrite a rotary run for the other RoPE pairing (half <-> interleaved); same perplexities",
    "bench": "training and evaluation speed and memory of every encoding, beside x-transformers",
    "study": "train the runs a study (conf/study/<name>.yaml) lacks, side by side, then report them",
}


def usage() -> str:
    lines = ["usage: posbench [-m] <command> [overrides ...]", "", "commands:"]
    lines += [f"  {name:<10} {text}" for name, text in COMMANDS.items()]
    lines += ["", "Hydra overrides: encoding=, model=, data=, seed=, device=, train.steps=, train.train_len=,",
              "train.batch_size=, train.lr=, eval.lengths=[...], eval.max_tokens=, checkpoint= (eval),",
              "wandb.mode=, hydra.run.dir=. `posbench <command> --help` shows every option.",
              "", "examples:", "  posbench train encoding=alibi",
              "  posbench -m train encoding=sinusoidal,rope,t5,alibi seed=0,1,2",
              "  posbench eval checkpoint=outputs/train/alibi/default eval.lengths=[128,512,2048]",
              "  posbench report multirun/<date>"]
    return "\n".join(lines)


def _flag_value(args: list[str], *flags: str) -> str | None:
    """The value of ``--flag VALUE`` or ``--flag=VALUE`` in ``args`` (the last one given)."""
    found = None
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in flags:
            found = value if eq else (args[i + 1] if i + 1 < len(args) else None)
    return found


def user_config_dirs(args: list[str]) -> list[Path]:
    """The config dirs a command line adds: ``--config-dir DIR`` / ``-cd DIR`` and
    ``hydra.searchpath=[file://DIR]``; a missing one is a one-line error."""
    from .plugins import config_dirs

    return existing_dirs(config_dirs(args, _flag_value(args, "--config-dir", "-cd")))


def existing_dirs(dirs: list[str]) -> list[Path]:
    """User config dirs as paths; a missing one is a one-line error."""
    for d in dirs:
        if not Path(d).is_dir():
            fail(f"config dir {str(d)!r} does not exist; valid: a directory holding group folders such as "
                 "encoding/NAME.yaml")
    return [Path(d) for d in dirs]


# The config groups whose members may come from outside the package -> (entry-point group,
# the module holding its registry, the registry's name there).
PLUGIN_GROUPS = {"encoding": ("posbench.encodings", "posbench.encodings", "ENCODINGS"),
                 "task": ("posbench.tasks", "posbench.data.tasks", "TASKS"),
                 "probe": ("posbench.probes", "posbench.eval.probes", "PROBES")}


def registry(group: str):
    """The :class:`posbench.plugins.Registry` of a plugin group (imported on demand: torch)."""
    import importlib

    _, module, name = PLUGIN_GROUPS[group]
    return getattr(importlib.import_module(module), name)


def group_choices(group: str, dirs: list[Path]) -> dict[str, Path | None]:
    """The choices of config group ``group`` -> their YAML file (None: an installed entry point
    of an encoding, task or probe, which needs none). A user config dir's file whose name is
    one of posbench's own is refused: it would silently replace the built-in."""
    from .plugins import entry_points

    builtin = {p.stem: p for p in sorted((conf_dir() / group).glob("*.yaml"))}
    choices: dict[str, Path | None] = dict(builtin)
    for d in dirs:
        for path in sorted((d / group).glob("*.yaml")):
            if path.stem in builtin:
                fail(f"{path} has the name of posbench's built-in {group} {path.stem!r}; valid: another file name")
            choices.setdefault(path.stem, path)
    if group in PLUGIN_GROUPS:
        for name in entry_points(PLUGIN_GROUPS[group][0]):
            choices.setdefault(name, None)
    return choices


def check_group_choices(args: list[str], dirs: list[Path] = ()) -> dict[str, dict[str, Path | None]]:
    """`encoding=nope2` -> one line listing the valid encodings (before Hydra composes), counting
    user config dirs and installed plugins. -> the choices asked for in each group, with their
    YAML file (None: an entry-point member)."""
    root = conf_dir()
    asked: dict[str, dict[str, Path | None]] = {}
    for arg in args:
        if arg.startswith(("-", "+", "~", "hydra")) or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        group = key.replace(".", "/")
        if not (root / group).is_dir() or value in ("null", ""):
            continue
        choices = group_choices(group, list(dirs))
        for choice in value.split(","):
            if choice not in choices:
                fail(f"unknown {key} {choice!r}; valid choices: {', '.join(sorted(choices))}")
            path = choices[choice]
            if path is not None and path.parent.parent != root and group in PLUGIN_GROUPS:
                _check_plugin_yaml(path, group)
            asked.setdefault(group, {})[choice] = path
    return asked


def _check_plugin_yaml(path: Path, group: str = "encoding") -> dict:
    """A user's ``encoding/NAME.yaml`` (or ``task/``, ``probe/``) either names its class
    (``_target_``) and itself (``name: NAME``, or no ``name:``), or sets options of a built-in (``name: alibi``,
    no ``_target_``). -> its contents."""
    from omegaconf import OmegaConf

    try:
        cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    except Exception as e:  # YAML that does not parse
        raise PosbenchError(f"{path} is not a valid YAML mapping ({' '.join(str(e).split())}); valid: "
                            f"_target_: pkg.module.Class and its options, one key: value a line") from None
    if not isinstance(cfg, dict):
        raise PosbenchError(f"{path} holds {type(cfg).__name__}, not a mapping; valid: _target_: pkg.module.Class "
                            "and its options, one key: value a line")
    if cfg.get("_target_"):
        if cfg.setdefault("name", path.stem) != path.stem:  # no name: its file name
            raise PosbenchError(f"{path} says name: {cfg['name']}; valid: name: {path.stem} (its file name), "
                                "or no name:")
    elif not (conf_dir() / group / f"{cfg.get('name')}.yaml").is_file():
        base = {"encoding": "posbench.encodings.PositionEncoding", "task": "posbench.data.tasks.Task",
                "probe": "posbench.eval.probe.Probe"}[group]
        raise PosbenchError(f"{path} names no class and no built-in {group} (name: {cfg.get('name')}); valid: "
                            f"_target_: pkg.module.Class (a subclass of {base}) with "
                            f"name: {path.stem}, or name: <a built-in {group}> with its options")
    return cfg


def store_plugin_configs(asked: dict[str, dict[str, Path | None]]) -> None:
    """Give Hydra a config for each installed entry-point member asked for (the choices of
    :func:`check_group_choices` without a YAML file): its options' defaults and how to import
    it (:meth:`posbench.plugins.Registry.plugin_config`). Hydra's ConfigStore travels to the
    workers of every launcher with Hydra's own state."""
    for group, choices in asked.items():
        wanted = [name for name, path in choices.items() if path is None]
        if not wanted:
            continue
        from hydra.core.config_store import ConfigStore

        members = registry(group)
        for name in wanted:
            members.class_of({"name": name})  # a plugin that failed to load: its one-line error
            ConfigStore.instance().store(group=group, name=name, node=members.plugin_config(name))


def fill_choice_names(config, groups=("encoding", "task", "probe")) -> None:
    """A config dir's ``encoding/NAME.yaml`` (or ``task/``, ``probe/``) that leaves ``name:`` out
    is named NAME, its file name, as Hydra chose it (``hydra.runtime.choices``)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig, open_dict

    if not HydraConfig.initialized():
        return
    choices = HydraConfig.get().runtime.choices
    for group in groups:
        node = config.get(group)
        if isinstance(node, DictConfig) and node.get("name") is None and choices.get(group):
            with open_dict(node):
                node.name = str(choices[group])


def check_encoding_options(config) -> None:
    """A PosbenchError for the first option of ``config.encoding`` that its class (built-in or
    plugin) does not take or that has another type than it declares."""
    from omegaconf import OmegaConf

    from .encodings import encoding_class
    from .config import check_options

    options = OmegaConf.to_container(config.encoding, resolve=True)
    check_options(encoding_class(options), options, "encoding", str(options.get("name")))


def encoding_options_callback():
    """The Hydra callback of ``conf/app_train.yaml`` that names a config dir's nameless encoding
    after its file and checks the encoding's options (names and types) before Hydra makes the run
    dir, so ``encoding.base=abc`` is one line and leaves no folder. (Built here, not at import:
    the other commands need no Hydra.)"""
    from hydra.core.hydra_config import HydraConfig
    from hydra.experimental.callback import Callback

    class EncodingOptions(Callback):
        def on_run_start(self, config, **kwargs) -> None:
            HydraConfig.instance().set_config(config)  # what run_job does first: resolves ${hydra:...}
            fill_choice_names(config)  # the task gets this config object
            try:
                check_encoding_options(config)
            except PosbenchError as e:  # Hydra turns a callback's exception into a warning and goes on
                fail(str(e))
            except Exception:  # anything else (an interpolation that does not resolve): the run reports it
                return

    return EncodingOptions()


def _rank() -> int:
    """This process's rank under torchrun / Slurm tasks (0 when alone)."""
    from .runs.distributed import world

    return world().rank


def _remove_fresh_run_dir(run_dir: Path) -> None:
    """Undo what Hydra created for a job that failed before writing any checkpoint: the run dir,
    then the parents created with it (``outputs/train/alibi/``) while they are empty."""
    if _rank() > 0 or (run_dir / "checkpoints").exists() or (run_dir / "results.csv").exists():
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
    from .runs.callbacks import NEW_DIRS

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
    from .runs.rundir import atomic_write_text

    SWEEP_FAILURES.append(f"{job_dir}: {message}")
    print(f"posbench: error in job {job_dir}: {message}", file=sys.stderr)
    atomic_write_text(job_dir / "FAILED", message + "\n" + (f"\n{details}" if details else ""))


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
        if isinstance(e, RunDirBusy):  # no FAILED in a dir another process works in
            SWEEP_FAILURES.append(f"{job_dir}: {e}")
            print(f"posbench: error in job {job_dir}: {e}", file=sys.stderr)
        elif isinstance(e, PosbenchError):
            _record_failure(job_dir, str(e))
        else:
            traceback.print_exc()
            first = (str(e).splitlines() or [""])[0]
            _record_failure(job_dir, f"{type(e).__name__}: {first}", traceback.format_exc())


def _use_threads() -> None:
    """Torch threads for this job (:mod:`posbench.runs.threads`): the cores other processes leave
    idle, re-checked as the job runs; jobs run side by side by a local parallel launcher (joblib)
    split the cores between them (cores / n_jobs at most each)."""
    from hydra.core.hydra_config import HydraConfig

    from .runs import threads

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

    from .report.tables import draw_run
    from .runs.lock import hold
    from .runs.output import tee_to
    from .train.loop import train

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    _use_threads()
    log = tee_to(run_dir / "train.log") if _rank() == 0 else nullcontext()  # what the run prints, kept
    with log, user_errors(run_dir), hold(run_dir, "train"):  # one train per run dir
        fill_choice_names(cfg)  # a sweep job's (a single run's were filled before its run dir existed)
        check_encoding_options(cfg)  # a sweep job's (a single run's was checked before its run dir existed)
        finished = train(cfg, run_dir)
        if finished.rows is None:  # not rank 0: rank 0 evaluates and reports
            return
        (run_dir / "FAILED").unlink(missing_ok=True)  # an earlier attempt's failure is over
        draw_run(run_dir)
        print(finished.summary)
        print(f"\nrun dir: {run_dir}  ({finished.files})")


def _eval_lock(cfg):
    """Evaluations of a run may overlap (their merges are serialised), a training of it may not."""
    from .runs.lock import hold
    from .runs.rundir import RunDir

    if not cfg.get("checkpoint"):
        return nullcontext()  # evaluate() names what is missing
    return hold(RunDir.existing(cfg.checkpoint).path, "eval", shared=True)


def _eval_task(cfg) -> None:
    from omegaconf import OmegaConf

    from .eval.ladder import evaluate
    from .eval.results import markdown_results
    from .report.tables import draw_run
    from .runs.rundir import RunDir
    from .train.workload import check_later_evaluation

    _use_threads()
    fill_choice_names(cfg, ("probe",))
    if cfg.get("pretrained"):
        return _eval_pretrained(cfg)
    with user_errors(None), _eval_lock(cfg):
        if cfg.get("checkpoint"):
            run = RunDir.existing(cfg.checkpoint)
            check_later_evaluation(OmegaConf.load(run.config), cfg.checkpoint)
        if cfg.get("probe"):
            from .eval.probes import run_probe

            probe, rows = run_probe(cfg)
            draw_run(cfg.checkpoint)
            print(probe.markdown(rows))
            print(f"\nresults merged into {Path(cfg.checkpoint) / f'{probe.name}.csv'} ({probe.name}.png)")
            return
        rows = evaluate(cfg)
        draw_run(cfg.checkpoint)
        print(markdown_results(rows))
        print(f"\nresults in {Path(cfg.checkpoint) / 'results.csv'} (binned loss by position: positions.csv)")


def resolve_pretrained(cfg) -> None:
    """``pretrained=smollm2-135m`` (a name of :data:`posbench.plugins.KNOWN_MODELS`, where no such
    path exists) -> the .gguf file inside its installed package, found without importing it."""
    from omegaconf import open_dict

    from .data.corpus import default_cache_dir
    from .plugins import KNOWN_MODELS, known_model_file

    name = str(cfg.pretrained)
    if Path(name).expanduser().exists():
        return
    if name not in KNOWN_MODELS:
        raise PosbenchError(f"pretrained={name} does not exist; valid: a local model directory (config.json, weights, "
                            f"tokenizer.json), a .gguf file, or an installed model: {', '.join(KNOWN_MODELS)} "
                            "(nothing is downloaded)")
    with open_dict(cfg):
        cfg.pretrained = str(known_model_file(name, default_cache_dir() / "pretrained"))


def _eval_pretrained(cfg) -> None:
    """``posbench eval pretrained=PATH|NAME``: the ladder of a Hugging Face model (posbench.eval.pretrained)."""
    from .eval.results import markdown_results
    from .report.tables import draw_run

    with user_errors(None):
        if cfg.get("checkpoint"):
            fail(f"checkpoint={cfg.checkpoint} and pretrained={cfg.pretrained} both name a model; valid: one of them")
        resolve_pretrained(cfg)
        if cfg.get("probe"):
            from .eval.pretrained import probe_pretrained

            probe, rows, out = probe_pretrained(cfg)
            draw_run(out)
            print(probe.markdown(rows))
            print(f"\nresults merged into {out / f'{probe.name}.csv'} ({probe.name}.png)")
            return
        from .eval.pretrained import evaluate_pretrained

        out, rows = evaluate_pretrained(cfg)
        draw_run(out)
        print(markdown_results(rows))
        print(f"\nresults in {out / 'results.csv'} (binned loss by position: positions.csv)")


def hydra_error(e: Exception, args: list[str]) -> str:
    """Hydra's multi-line error as one line naming the bad override and what is valid."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException
    from omegaconf import DictConfig

    if isinstance(e, OverrideParseException):
        parser = OverridesParser.create()
        for arg in args:
            if arg.startswith("-") or ("=" not in arg and not arg.startswith("~")):
                continue  # a flag or a flag's value
            try:
                parser.parse_overrides([arg])
            except OverrideParseException as bad:
                return (f"cannot parse override {arg!r} ({str(bad).splitlines()[0]}); valid: key=value, "
                        "e.g. train.steps=100, eval.lengths=[128,256], encoding=alibi,rope "
                        "(https://hydra.cc/docs/advanced/override_grammar/basic)")
    cause = e.__cause__
    key, parent = getattr(cause, "full_key", None), getattr(cause, "parent_node", None)
    if key and isinstance(parent, DictConfig):
        section = key.rpartition(".")[0]
        close = similar_keys(key, config_keys(parent._get_root(), with_hydra=key.startswith("hydra.")))
        return (f"unknown key {key!r}; valid keys{' in ' + section if section else ''}: "
                f"{', '.join(sorted(map(str, parent)))}"
                + (f"; did you mean {' or '.join(close)}?" if close else "") + f" (+{key}=... adds a new key)")
    return " ".join(str(e).split())


def config_keys(cfg, prefix: str = "", with_hydra: bool = False) -> list[str]:
    """Every dotted key of a composed config, interpolations left unresolved (Hydra's own
    ``hydra.*`` only with ``with_hydra``)."""
    from omegaconf import OmegaConf

    tree = OmegaConf.to_container(cfg, resolve=False) if not isinstance(cfg, dict) else cfg
    keys = []
    for name, value in tree.items():
        if prefix or with_hydra or name != "hydra":
            keys.append(prefix + str(name))
            if isinstance(value, dict):
                keys += config_keys(value, f"{prefix}{name}.", with_hydra)
    return keys


def similar_keys(key: str, keys: list[str], n: int = 3) -> list[str]:
    """The keys a mistyped ``key`` may mean: those ending in the same name (``steps`` ->
    ``train.steps``), else the closest dotted keys (``train.stepz``), else those whose last name
    is close (``stepz`` -> ``train.steps``)."""
    import difflib

    last = key.rpartition(".")[2]
    same = [k for k in keys if k != key and k.rpartition(".")[2] == last]
    if same:
        return same[:n]
    close = difflib.get_close_matches(key, keys, n=n, cutoff=0.8)
    if close:
        return close
    names = difflib.get_close_matches(last, sorted({k.rpartition(".")[2] for k in keys}), n=n, cutoff=0.8)
    return [k for k in keys if k.rpartition(".")[2] in names][:n]


MODES = {"run": "--run", "multirun": "-m/--multirun", "cfg": "--cfg", "info": "--info",
         "shell_completion": "--shell-completion"}


# Overrides whose value is a path: posbench's run dirs hold '=' and ',' (a sweep job's
# ``alibi/experiment=smoke,seed=0``), which Hydra's override grammar reads as syntax.
PATH_KEYS = ("checkpoint", "train.branch_from", "train.init_from", "hydra.run.dir", "hydra.sweep.dir")
OUTPUT_DIR_KEYS = ("hydra.run.dir", "hydra.sweep.dir")  # quoted also before they exist: they name a new dir


def _quoted(path: str) -> str:
    """``path`` as a quoted Hydra string, read back verbatim (in Hydra's quoted strings only a
    quote needs its backslash)."""
    return "'" + path.replace("'", "\\'") + "'"


def path_arguments(command: str, overrides: list[str], multirun: bool) -> list[str]:
    """Run dirs as typed. ``posbench eval RUN_DIR`` means ``checkpoint=RUN_DIR`` (several run
    dirs with -m: a sweep over them), and a value of ``checkpoint=``, ``train.branch_from=``, ``train.init_from=``,
    ``hydra.run.dir=`` or ``hydra.sweep.dir=`` that is an existing path is quoted for Hydra, as
    is a new ``hydra.run.dir``/``hydra.sweep.dir`` with an ``=`` in it (``runs/threads=2``).
    Other values (``checkpoint=a,b`` with -m: a sweep) pass as they are."""
    out, run_dirs = [], []
    for arg in overrides:
        key, eq, value = arg.partition("=")
        if command == "eval" and not arg.startswith(("+", "~")) and Path(arg).exists() and (
                not eq or "/" in key or Path(key).exists()):
            run_dirs.append(arg)  # a path, '=' and all (a key never holds a '/')
        elif eq and key.lstrip("+") in PATH_KEYS and value and value[0] not in "'\"" and (
                Path(value).exists() or (key.lstrip("+") in OUTPUT_DIR_KEYS and "=" in value)):
            out.append(f"{key}={_quoted(value)}")
        else:
            out.append(arg)
    if len(run_dirs) > 1 and not multirun:
        fail(f"posbench eval: {len(run_dirs)} run dirs given ({', '.join(run_dirs)}); valid: one run dir, "
             "or -m to evaluate each (posbench -m eval DIR1 DIR2 ...)")
    if run_dirs:
        out.insert(0, "checkpoint=" + ",".join(map(_quoted, run_dirs)))
    return out


def check_hydra_flags(command: str, args: list[str]) -> list[str]:
    """Flag misuse that Hydra answers with a usage text or a traceback (``-m --cfg hydra``,
    ``--cfg bogus``, ``--resolve`` alone, ``--package`` without ``--cfg``, an unknown flag, a
    missing rerun file) -> one line naming the flag and what is valid. -> ``args`` with the flags
    first: Hydra's parser takes overrides only before or only after its flags."""
    from hydra._internal.utils import get_args_parser

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            fail(f"posbench {command}: {message}; valid flags: --cfg job|hydra|all [--package P] [--resolve], "
                 "--info [all|config|defaults|defaults-tree|plugins|searchpath], -m, --help, --hydra-help "
                 "(overrides are key=value, without dashes)")

    parser = get_args_parser()
    parser.__class__ = Parser
    ns, extra = parser.parse_known_intermixed_args(args)
    unknown = [a for a in extra if a.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    ns.overrides += extra
    modes = [flag for dest, flag in MODES.items() if getattr(ns, dest)]
    if len(modes) > 1:
        fail(f"posbench {command}: {' and '.join(modes)} cannot be combined; valid: one of -m (a sweep), "
             "--cfg job|hydra|all (print the config), --info (print Hydra's view), or none (one run)")
    ordered = [a for a in args if a not in ns.overrides] + path_arguments(command, ns.overrides, bool(ns.multirun))
    if ns.help or ns.hydra_help:
        return ordered
    if ns.resolve and not ns.cfg:
        fail(f"posbench {command}: --resolve only works with --cfg; valid: --cfg job --resolve")
    if ns.package and not ns.cfg:
        fail(f"posbench {command}: --package {ns.package} only works with --cfg; valid: --cfg job --package {ns.package}")
    if ns.experimental_rerun and not Path(ns.experimental_rerun).is_file():
        fail(f"posbench {command}: --experimental-rerun {ns.experimental_rerun!r} is not a file; "
             "valid: a run's .hydra/config.pickle")
    return ordered


# Config groups that belong to the other Hydra app. Hydra would answer "No match in the defaults
# list ... use +probe=passkey", which adds a group the command then ignores.
OTHER_APP_GROUPS = {"train": ("probe",), "eval": ("encoding", "model", "data", "train", "task", "logger", "experiment")}


def check_app_groups(command: str, args: list[str]) -> None:
    """``posbench train probe=passkey`` (or ``posbench eval encoding=rope``) -> one line naming
    the command the group belongs to. ``posbench eval ... hydra.run.dir=D`` -> one line saying
    where its results go (the run dir it evaluates, or ``out=``): Hydra would make D and leave it
    empty."""
    pretrained = command == "eval" and any(a.lstrip("+").startswith("pretrained=") for a in args)
    for arg in args:
        key, eq, value = arg.lstrip("+").partition("=")
        if command == "eval" and eq and key == "hydra.run.dir":
            where = ("out= (default outputs/pretrained/<model name>)" if pretrained
                     else "the run dir it evaluates (checkpoint=)")
            fail(f"hydra.run.dir={value} is not used by posbench eval: its results go to {where}; valid: "
                 + ("out=<dir> instead" if pretrained else "leave hydra.run.dir out"))
        if not eq or key not in OTHER_APP_GROUPS[command] or (pretrained and key == "data"):
            continue
        if command == "train":
            fail(f"{key}={value} belongs to posbench eval, not train; valid: train the run, then "
                 f"posbench eval checkpoint=<run dir> {key}={value}")
        fail(f"{key}={value} belongs to posbench train, not eval (eval takes the encoding, model and data "
             "from the run's config.yaml); valid: checkpoint=<run dir>, eval.*, probe=passkey, device=")


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

    from .config import run_name

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


def cmd_report(args: list[str]) -> None:
    from .report.baselines import export_baseline, resolve_baseline, shipped_baselines
    from .report.probes import THRESHOLD
    from .report.tables import REFERENCE, report

    parser = argparse.ArgumentParser(prog="posbench report", description=COMMANDS["report"])
    parser.add_argument("dirs", nargs="+", help="run dirs, sweep dirs, results.csv or tasks.csv files")
    parser.add_argument("--out", help="where the report files go (default: the single dir given, else ./report)")
    parser.add_argument("--format", default="md", choices=["md", "latex"],
                        help="table printed: Markdown (default) or LaTeX/booktabs (also written as report.tex)")
    parser.add_argument("--log-y", action="store_true", help="log-scale perplexity axis (default: linear)")
    ref = parser.add_mutually_exclusive_group()
    ref.add_argument("--reference", default="auto", metavar="PATH",
                     help=f"published results (encoding,train_len,eval_len,ppl) drawn beside ours (default: {REFERENCE} when it exists)")
    ref.add_argument("--no-reference", action="store_true", help="leave out the published-results panel")
    parser.add_argument("--by", action="append", default=[], metavar="KEY",
                        help="a dotted config key (e.g. encoding.bias_scale, model.embed_scale, train.steps) whose "
                             "value joins each line's label, so runs that differ in it are lines of their own; "
                             "repeat or comma-separate for several")
    parser.add_argument("--baseline", action="append", default=[], metavar="NAME|DIR",
                        help="shipped runs reported beside yours with paired intervals, without retraining them: "
                             f"a shipped baseline ({', '.join(shipped_baselines()) or 'none shipped'}) or a folder "
                             "made by --export-baseline; repeatable")
    parser.add_argument("--threshold", type=float, default=None, metavar="SCORE",
                        help="the score in [0, 1] a probe's effective length keeps at every length up to it "
                             "(RULER's rule; default 0.5)")
    parser.add_argument("--lines", action="append", default=[], metavar="NAMES",
                        help="the lines the per-line figures (report.png, positions, training) draw, comma-separated "
                             "as the table or legend names them (default: all up to 8 lines; past 8, the report "
                             "draws ranked.png and tradeoff.png of every line and picks the best, the worst and the "
                             "baselines)")
    parser.add_argument("--mix", action="store_true",
                        help="report runs scored on different text (corpus, split, vocabulary, scored tokens) "
                             "together, each text's lines apart (default: refuse, naming what differs)")
    parser.add_argument("--export-baseline", metavar="OUT",
                        help="instead of a report, write what paired intervals need of the runs under DIRS "
                             "(results, config, per-block NLL sums: a few KiB per run) to OUT")
    ns = parser.parse_args(args)
    if ns.export_baseline:
        written = export_baseline(ns.dirs, ns.export_baseline)
        print(f"wrote {len(written)} run(s) to {ns.export_baseline}: posbench report <your runs> "
              f"--baseline {ns.export_baseline}")
        return
    by = [k for arg in ns.by for k in arg.split(",") if k]
    threshold = THRESHOLD if ns.threshold is None else ns.threshold
    if not 0 <= threshold <= 1:
        raise PosbenchError(f"report: --threshold {threshold:g} is not valid; valid: a score in [0, 1], e.g. 0.5")
    baselines = [str(resolve_baseline(b)) for b in ns.baseline]
    done = report(ns.dirs, ns.out, fmt=ns.format, log_y=ns.log_y, reference=None if ns.no_reference else ns.reference,
                  by=by, baselines=baselines, threshold=threshold, mix=ns.mix, lines=ns.lines)
    if done.header:
        print(done.header + "\n")
    if done.table:
        print(done.table)
        print("\n" + "\n".join(done.text))
    if done.tasks is not None:
        print(("\n" if done.table else "") + done.tasks.table)
    print(f"\nwrote {', '.join(map(str, done.files))}")


def encoding_param_counts(names: list[str], broken: dict[str, str] | None = None) -> dict[str, dict[str, int]]:
    """Encoding name -> {'params', 'pos_params'} of the default model (``posbench train`` with no
    overrides but ``encoding=``: model tiny, the default corpus's vocabulary size data.vocab_size,
    train.train_len), built on the CPU without loading any data. (The meta device would allocate
    nothing but costs more here: its first use takes longer than the 21 small builds.) A plugin
    that cannot be built there goes to ``broken`` (name -> why) instead."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    from .model.build import build_model
    from .encodings import ENCODINGS, PLUGINS, plugin_config

    with initialize_config_dir(str(conf_dir()), version_base=None):
        cfg = compose(HYDRA_APPS["train"])
    counts = {}
    for name in names:
        yaml = conf_dir() / "encoding" / f"{name}.yaml"
        with open_dict(cfg):
            cfg.encoding = OmegaConf.load(yaml) if name not in PLUGINS else OmegaConf.create(plugin_config(name))
        try:
            counts[name] = build_model(cfg, int(cfg.data.vocab_size)).param_counts()
        except PosbenchError:
            if broken is None or not ENCODINGS.errors:
                raise
            # a plugin named like a built-in (listed as broken) blocks that built-in and those that use it
        except Exception as e:
            if name not in PLUGINS or broken is None:
                raise  # a built-in that does not build is a bug
            first = (str(e).splitlines() or [""])[0]
            broken[name] = (f"encoding plugin {name!r} ({PLUGINS[name]}) cannot be built in the default model "
                            f"({type(e).__name__}: {first})")
    return counts


def _register_config_dir_encodings(dirs: list[Path]) -> dict[str, str]:
    """Import and register the ``_target_`` encodings of user config dirs, for listings. -> file
    name -> why it could not be (YAML that does not parse, a class that does not import, ...)."""
    from .encodings import encoding_class

    broken = {}
    for d in dirs:
        for path in sorted((d / "encoding").glob("*.yaml")):
            try:
                cfg = _check_plugin_yaml(path)
                if cfg.get("_target_"):
                    encoding_class(cfg)
            except PosbenchError as e:
                broken[path.stem] = str(e) if str(path) in str(e) else f"{path}: {e}"
    return broken


def cmd_encodings(args: list[str]) -> None:
    """The listing: every encoding that loads, then one line per plugin that does not (an entry
    point whose module is gone, a config dir's file that does not parse), naming its package or
    file and the error, so one broken plugin hides neither the others nor itself."""
    from .encodings import ENCODINGS, PLUGINS, REGISTRY
    from .report.tables import count_text

    parser = argparse.ArgumentParser(prog="posbench encodings", description=COMMANDS["encodings"])
    parser.add_argument("--config-dir", "-cd", action="append", default=[], metavar="DIR",
                        help="also list the _target_ encodings of DIR/encoding/*.yaml")
    ns = parser.parse_args(args)
    broken = dict(ENCODINGS.errors)
    broken.update(_register_config_dir_encodings(existing_dirs(ns.config_dir)))
    counts = encoding_param_counts(sorted(REGISTRY), broken)
    listed = {name: cls for name, cls in sorted(REGISTRY.items()) if name in counts or name not in broken}
    width = max(map(len, [*listed, *broken]))
    hook = max(len("hook"), *(len(cls.hook_kind()) for cls in listed.values()))
    print(f"{'encoding':<{width}}  {'hook':<{hook}}  {'params':>6}  {'position':>8}  description  [paper]")
    for name, cls in listed.items():
        total, pos = (count_text(counts[name]["params"]), count_text(counts[name]["pos_params"])) if name in counts \
            else ("?", "?")  # blocked by a broken plugin of its name

        plugin = f"  (plugin: {PLUGINS[name]})" if name in PLUGINS else ""
        print(f"{name:<{width}}  {cls.hook_kind():<{hook}}  {total:>6}  {pos:>8}  {cls.description}  "
              f"[{cls.paper}]{plugin}")
    for name, why in sorted(broken.items()):
        print(f"{name:<{width}}  {'broken':<{hook}}  {why}")
    print("(params: all parameters of the default model, model=tiny with the default corpus's vocabulary; "
          "position: those of the position encoding)")
    from .config import MODEL_OPTIONS

    print("\nmodel options, with any encoding (posbench train encoding=E OPTION):")
    width = max(len(o) for o, _, _ in MODEL_OPTIONS)
    for option, description, paper in MODEL_OPTIONS:
        print(f"{option:<{width}}  {description}  [{paper}]")


def config_dir_encoding(name: str, dirs: list[Path]) -> tuple[type | None, dict]:
    """``posbench check --config-dir DIR NAME``: the class and options of ``DIR/encoding/NAME.yaml``
    (its ``_target_``, or the built-in it sets options of), or (None, {}) where no dir has it.
    Options that interpolate a run's keys (``${train.train_len}``) take the constructor's default."""
    from .encodings import encoding_class
    from .plugins import META_KEYS

    for d in dirs:
        path = d / "encoding" / f"{name}.yaml"
        if path.is_file():
            cfg = _check_plugin_yaml(path)
            options = {k: v for k, v in cfg.items() if k != "name" and k not in META_KEYS
                       and not (isinstance(v, str) and "${" in v)}
            return encoding_class(cfg), options
    return None, {}


def cmd_check(args: list[str]) -> None:
    from .model.conformance import CHECKS, ConformanceError, check_encoding, resolve

    parser = argparse.ArgumentParser(prog="posbench check", description=COMMANDS["check"],
                                     epilog="checks: " + ", ".join(CHECKS) + " (posbench.testing; docs/extending.md)")
    parser.add_argument("encoding", help="a registered name, a config dir's encoding (--config-dir), or the class as "
                                         "pkg.module:Class")
    parser.add_argument("options", nargs="*", metavar="KEY=VALUE",
                        help="constructor options (YAML values); model.KEY=VALUE: a model option to check with it "
                             "(e.g. model.length_scaling=ssmax)")
    parser.add_argument("--only", default=",".join(CHECKS), help="comma-separated checks to run (default: all)")
    parser.add_argument("--config-dir", "-cd", action="append", default=[], metavar="DIR",
                        help="read ENCODING from DIR/encoding/ENCODING.yaml: its _target_ (or built-in name) and "
                             "its options, which KEY=VALUE options override")
    ns = parser.parse_args(args)
    import yaml

    cls, options = config_dir_encoding(ns.encoding, existing_dirs(ns.config_dir))
    model = {}
    for item in ns.options:
        key, eq, value = item.partition("=")
        if not eq:
            fail(f"option {item!r} is not KEY=VALUE; valid: e.g. base=500000.0")
        if key.startswith("model."):
            model[key.removeprefix("model.")] = yaml.safe_load(value)
        else:
            options[key] = yaml.safe_load(value)  # 2.0 -> float, true -> bool, as in a config file
    if model:
        from .config import model_config

        model_config(model)  # an unknown or bad model option is one line
    from .config import check_options

    cls = cls or resolve(ns.encoding)
    check_options(cls, options, "encoding", cls.name or cls.__name__)  # names and types, as posbench train does
    checks = [c for c in ns.only.split(",") if c]
    failed = 0
    for check in checks:
        try:
            check_encoding(cls, options, [check], model=model)
            print(f"ok    {check}")
        except ConformanceError as e:
            failed += 1
            print(f"FAIL  {check}: {e}")
    print(f"{cls.name or cls.__name__}: {len(checks) - failed} of {len(checks)} checks passed")
    if failed:
        raise SystemExit(1)


def cmd_convert(args: list[str]) -> None:
    from .convert import PAIRINGS, convert_run

    parser = argparse.ArgumentParser(prog="posbench convert", description=COMMANDS["convert"])
    parser.add_argument("run", help="a run dir made by `posbench train` with encoding rope or xpos")
    parser.add_argument("--pairing", required=True, choices=PAIRINGS, help="the RoPE pairing to convert to")
    parser.add_argument("--out", required=True, help="the new run dir (config.yaml, checkpoints/last.pt)")
    ns = parser.parse_args(args)
    out = convert_run(ns.run, ns.pairing, ns.out)
    print(f"wrote {out} (encoding.pairing={ns.pairing}); evaluate it with: posbench eval checkpoint={out}")


def cmd_study(args: list[str]) -> None:
    from .study import main as study_main

    study_main(args)


def cmd_bench(args: list[str]) -> None:
    from .bench import main as bench_main

    bench_main(args)


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


def main(argv: list[str] | None = None) -> None:
    with quiet_broken_pipe():
        dispatch(list(sys.argv[1:] if argv is None else argv))


def dispatch(argv: list[str]) -> None:
    command_at = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if command_at is None:
        print(usage())
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") or not argv else 2)
    command, before, after = argv[command_at], argv[:command_at], argv[command_at + 1:]
    if command not in COMMANDS:
        fail(f"unknown command {command!r}; valid choices: {', '.join(COMMANDS)}")
    multirun = [a for a in before if a in ("-m", "--multirun")]
    if len(multirun) != len(before):
        fail(f"unknown option {next(a for a in before if a not in multirun)!r} before the command; "
             "put Hydra flags after it")
    try:
        if command in HYDRA_APPS:
            run_hydra(command, multirun + after)
        elif multirun:
            fail(f"-m/--multirun applies to train and eval, not {command}")
        else:
            {"report": cmd_report, "encodings": cmd_encodings, "check": cmd_check, "convert": cmd_convert,
             "bench": cmd_bench, "study": cmd_study}[command](after)
    except PosbenchError as e:
        fail(str(e))


if __name__ == "__main__":
    main()
