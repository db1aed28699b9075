"""Finding code from outside the package: entry points and import paths, one place for both.

posbench's registries (encodings, tasks, probes) take members from three places, the same way:

* built-ins, registered when their module is imported;
* an installed package that declares them under an entry-point group (``posbench.encodings``,
  ``posbench.tasks``, ``posbench.probes``), name -> ``module:Class``, in its pyproject::

      [project.entry-points."posbench.encodings"]
      mine = "my_package.encoding:MyEncoding"

* a config file a user keeps outside the package (``--config-dir DIR``), whose ``_target_``
  names the class by its import path, Hydra's convention: ``_target_: my_package.encoding.MyEncoding``.

A run records ``_target_`` (and ``_package_``, the distribution and version that provided it)
beside the options in its config.yaml, so a new process (``posbench eval``, resume, report)
imports the same class; both keys start with ``_``, are never constructor options, and stay
out of the config hash. This module imports no torch and nothing of posbench but its errors.
"""

from __future__ import annotations

import importlib
from importlib import metadata

from .errors import PosbenchError

TARGET = "_target_"    # the import path of a plugin's class, in its config
PACKAGE = "_package_"  # "distribution==version" that provided it (informational)
META_KEYS = (TARGET, PACKAGE)


def entry_points(group: str) -> dict[str, metadata.EntryPoint]:
    """Name -> entry point of every installed distribution's ``group`` (last one wins on a tie;
    :func:`duplicates` names ties)."""
    return {ep.name: ep for ep in metadata.entry_points(group=group)}


def duplicates(group: str) -> dict[str, list[str]]:
    """Names that two installed distributions both declare in ``group`` -> their values."""
    seen: dict[str, list[str]] = {}
    for ep in metadata.entry_points(group=group):
        seen.setdefault(ep.name, []).append(ep.value)
    return {name: values for name, values in seen.items() if len(values) > 1}


def target_of(cls: type) -> str:
    """``pkg.module.Class``: the dotted import path :func:`import_target` reads back."""
    return f"{cls.__module__}.{cls.__qualname__}"


def import_target(path: str, what: str) -> type:
    """The class at ``path`` (``pkg.module.Class`` or ``pkg.module:Class``); a missing module or
    attribute is one PosbenchError naming it and how to make it importable."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise PosbenchError(f"{what}: _target_ {path!r} is not an import path; valid: pkg.module.Class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        missing = getattr(e, "name", None) or module_name
        raise PosbenchError(f"{what} needs module {missing!r} ({path}), which cannot be imported here "
                            f"({type(e).__name__}: {e}); install the package that provides it (pip install ...) "
                            "or put its directory on PYTHONPATH") from e
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PosbenchError(f"{what}: module {module_name!r} has no {attr!r} (from _target_ {path!r})")
        obj = getattr(obj, part)
    return obj


def distribution_of(cls: type) -> str | None:
    """``name==version`` of the installed distribution whose files hold ``cls``'s top-level
    package, or None (a module on PYTHONPATH, a config dir)."""
    top = cls.__module__.split(".")[0]
    names = metadata.packages_distributions().get(top, [])
    if not names:
        return None
    try:
        return f"{names[0]}=={metadata.version(names[0])}"
    except metadata.PackageNotFoundError:
        return None


def config_dirs(args: list[str], config_dir: str | None = None) -> list[str]:
    """User config directories of a command line: ``--config-dir DIR`` (Hydra's flag, parsed by
    the caller) and ``hydra.searchpath=[file://DIR,...]`` overrides."""
    dirs = [config_dir] if config_dir else []
    for arg in args:
        key, _, value = arg.partition("=")
        if key.lstrip("+") != "hydra.searchpath":
            continue
        for item in value.strip("[]").split(","):
            item = item.strip().strip("'\"")
            if item.startswith("file://"):
                dirs.append(item.removeprefix("file://"))
    return dirs
