"""Checks of a Hydra command line before Hydra composes it, and Hydra's own errors as one line.

Group choices (``encoding=``, ``model=``, ``data=``, ...), counting user config dirs and installed
plugins; a config dir's plugin YAML; flags Hydra would answer with a usage text or a traceback;
groups of the other app; run dirs typed as paths; an unknown key, with the keys it may mean. Each
mistake is one ``posbench: error: ...`` line, exit status 2, before any run dir exists. The Hydra
callback of ``conf/app_train.yaml`` (:func:`encoding_options_callback`) checks the encoding's
options once the config is composed, still before the run dir is made.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import conf_dir
from ..errors import PosbenchError, fail


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
    from ..plugins import config_dirs

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
    from ..plugins import entry_points

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
                own = "" if group != "encoding" else (
                    f" (one of your own: pass --config-dir DIR, DIR holding {group}/{choice}.yaml, or install the "
                    "package that declares it; posbench encodings lists what is found)")
                fail(f"unknown {key} {choice!r}; valid choices: {', '.join(sorted(choices))}{own}")
            path = choices[choice]
            if path is not None and path.parent.parent != root and group in PLUGIN_GROUPS:
                check_plugin_yaml(path, group)
            asked.setdefault(group, {})[choice] = path
    return asked


def check_plugin_yaml(path: Path, group: str = "encoding") -> dict:
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

    from ..config import check_options
    from ..encodings import encoding_class

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
        fail(f"posbench {command}: --package {ns.package} only works with --cfg; "
             f"valid: --cfg job --package {ns.package}")
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

