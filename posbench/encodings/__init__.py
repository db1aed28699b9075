"""Position encodings: one registry from name to class. See :mod:`.base` for the hooks.

Every module in this package is imported here, so adding a built-in encoding is one class
decorated with ``@register`` in a module of this package, plus ``conf/encoding/<name>.yaml``.
An encoding from outside the package (docs/extending.md) subclasses :class:`PositionEncoding`
and is found one of two ways (:mod:`posbench.plugins`):

* an installed package's entry point in the group ``posbench.encodings`` (``name =
  "module:Class"``), loaded here; it needs no YAML: its constructor's keyword defaults are its
  options (:func:`plugin_config`);
* a user config dir's ``encoding/NAME.yaml`` with ``_target_: pkg.module.Class``, imported when a
  config names it (:func:`encoding_class`).

Either way the class joins :data:`REGISTRY` under its name, so everything that looks an
encoding up by name treats it like a built-in; :data:`PLUGINS` says where each came from.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Mapping
from typing import Any

from ..errors import PosbenchError
from ..plugins import META_KEYS, TARGET, distribution_of, duplicates, entry_points, import_target, target_of
from .base import HOOKS, REGISTRY, ModelDims, PositionEncoding, PositionRangeError, register

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")  # each module registers its encodings


@register
class NoPE(PositionEncoding):
    name = "nope"
    paper = "Haviv et al. 2022; Kazemnejad et al. 2023 (NoPE)"
    description = "no position information; causal masking alone orders tokens"
    reads_positions = False


ENTRY_POINTS = "posbench.encodings"
BUILTINS = frozenset(REGISTRY)
PLUGINS: dict[str, str] = {}         # plugin name -> where it came from, for listings
PLUGIN_ERRORS: dict[str, str] = {}   # entry-point name -> why it could not be registered


def register_plugin(name: str, cls: object, origin: str) -> type[PositionEncoding]:
    """Add an outside encoding class to :data:`REGISTRY` under ``name`` (again: a no-op). A
    PosbenchError when it is no :class:`PositionEncoding` or its name is taken by another class."""
    where = target_of(cls) if isinstance(cls, type) else repr(cls)
    if not (isinstance(cls, type) and issubclass(cls, PositionEncoding)):
        raise PosbenchError(f"encoding {name!r} ({where}) is not a subclass of posbench.encodings.PositionEncoding")
    if REGISTRY.get(name) is cls:
        return cls
    if name in REGISTRY:
        kind = "built-in" if name in BUILTINS else "plugin"
        raise PosbenchError(f"encoding plugin {name!r} ({where}, {origin}) has the name of the {kind} encoding "
                            f"{name!r} ({target_of(REGISTRY[name])}); valid: a name not in {', '.join(sorted(REGISTRY))}")
    if cls.name and cls.name != name:
        raise PosbenchError(f"encoding plugin {name!r} ({where}, {origin}) says its name is {cls.name!r}; "
                            f"valid: the same name in both places, or no name attribute on the class")
    cls.name = name
    REGISTRY[name] = cls
    PLUGINS[name] = origin
    return cls


def _load_entry_points() -> None:
    """Register every installed ``posbench.encodings`` entry point; one that fails is remembered
    in :data:`PLUGIN_ERRORS` (reported when it is asked for, or by :func:`check_plugins`)."""
    for name, values in duplicates(ENTRY_POINTS).items():
        PLUGIN_ERRORS[name] = (f"encoding plugin {name!r} is declared by two installed packages ({', '.join(values)}); "
                               "valid: uninstall one")
    for name, ep in entry_points(ENTRY_POINTS).items():
        if name in PLUGIN_ERRORS:
            continue
        try:
            cls = ep.load()
        except Exception as e:  # a broken plugin must not break every other encoding
            PLUGIN_ERRORS[name] = (f"encoding plugin {name!r} (entry point {ep.value}) cannot be imported "
                                   f"({type(e).__name__}: {e}); reinstall or fix the package that declares it")
            continue
        dist = getattr(ep, "dist", None)
        origin = f"entry point of {dist.name}=={dist.version}" if dist else "entry point"
        try:
            register_plugin(name, cls, origin)
        except PosbenchError as e:
            PLUGIN_ERRORS[name] = str(e)


def check_plugins() -> None:
    """The first plugin that could not be registered, as a PosbenchError."""
    if PLUGIN_ERRORS:
        raise PosbenchError(next(iter(PLUGIN_ERRORS.values())))


def encoding_class(cfg: Mapping[str, Any]) -> type[PositionEncoding]:
    """The class an encoding config names: its ``_target_`` (imported and registered under
    ``name``), else ``REGISTRY[name]``."""
    name = cfg.get("name")
    if cfg.get(TARGET):
        cls = import_target(str(cfg[TARGET]), f"encoding {name!r}")
        return register_plugin(str(name or getattr(cls, "name", "")), cls, f"_target_ {cfg[TARGET]}")
    if name in PLUGIN_ERRORS:
        raise PosbenchError(PLUGIN_ERRORS[name])
    if name not in REGISTRY:
        raise PosbenchError(f"unknown encoding {name!r}; valid choices: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def plugin_config(name: str) -> dict:
    """The config of an entry-point encoding, which has no YAML: its name, how to import it
    (``_target_``, ``_package_``) and its constructor's keyword defaults (``???``, Hydra's
    missing value, for an option without one)."""
    cls = REGISTRY[name]
    defaults = {k: "???" if v is inspect.Parameter.empty else v for k, v in cls.defaults().items()}
    return {"name": name, TARGET: target_of(cls), "_package_": distribution_of(cls), **defaults}


def build_encoding(cfg: Mapping[str, Any], dims: ModelDims) -> PositionEncoding:
    """Instantiate ``cfg['name']`` (or its ``_target_``) with the remaining keys as keyword
    arguments."""
    params = {k: v for k, v in cfg.items() if k not in META_KEYS}
    cls = encoding_class(cfg)
    return cls.build(dims, params, params.pop("name", cls.name))


def saved_options(cfg: Mapping[str, Any]) -> dict:
    """A saved run's encoding config with the former default of every option it does not name
    (``former_defaults``): a run trained before ``t5.bias_scale`` existed was unscaled, and is
    rebuilt so. Unknown names pass through for :func:`build_encoding` to reject."""
    if cfg.get(TARGET):
        encoding_class(cfg)  # imports and registers the plugin class
    cls = REGISTRY.get(cfg.get("name"))
    return {**(cls.former_defaults if cls else {}), **cfg}


_load_entry_points()

__all__ = ["HOOKS", "PLUGINS", "REGISTRY", "ModelDims", "PositionEncoding", "PositionRangeError", "build_encoding",
           "check_plugins", "encoding_class", "plugin_config", "register", "register_plugin", "saved_options"]
