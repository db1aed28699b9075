"""Position encodings: one registry from name to class. See :mod:`.base` for the hooks.

Every module in this package is imported here, so adding a built-in encoding is one class
decorated with ``@register`` in a module of this package, plus ``conf/encoding/<name>.yaml``.
An encoding from outside the package (docs/extending.md) subclasses :class:`PositionEncoding`
and is found one of two ways (:mod:`posbench.plugins`):

* an installed package's entry point in the group ``posbench.encodings`` (``name =
  "module:Class"``), loaded here; it needs no YAML: its constructor's keyword defaults are its
  options (:meth:`~posbench.plugins.Registry.plugin_config`);
* a user config dir's ``encoding/NAME.yaml`` with ``_target_: pkg.module.Class``, imported when a
  config names it (:func:`encoding_class`).

Either way the class joins :data:`REGISTRY` under its name (:data:`ENCODINGS`, a
:class:`posbench.plugins.Registry`, as tasks and probes have), so everything that looks an
encoding up by name treats it like a built-in; :data:`PLUGINS` says where each came from.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Mapping
from typing import Any

from ..plugins import META_KEYS, TARGET, Registry
from .base import HOOKS, REGISTRY, ModelDims, PositionEncoding, PositionRangeError, register

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")  # each module registers its encodings


@register
class NoPE(PositionEncoding):
    name = "nope"
    paper = "Haviv et al. 2022; Kazemnejad et al. 2023 (NoPE)"
    description = "no position information; causal masking alone orders tokens"
    reads_positions = False


def _options(cls: type[PositionEncoding]) -> dict:
    """An entry-point encoding's options: its constructor's keyword defaults (``???``, Hydra's
    missing value, for an option without one)."""
    return {k: "???" if v is inspect.Parameter.empty else v for k, v in cls.defaults().items()}


ENCODINGS = Registry("encoding", PositionEncoding, "posbench.encodings", _options, members=REGISTRY).load()
BUILTINS = ENCODINGS.builtins
PLUGINS: dict[str, str] = ENCODINGS.plugins              # plugin name -> where it came from
PLUGIN_ERRORS: dict[str, str] = ENCODINGS.errors         # entry-point name -> why it is not registered
register_plugin = ENCODINGS.add
check_plugins = ENCODINGS.check
encoding_class = ENCODINGS.class_of
plugin_config = ENCODINGS.plugin_config


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


__all__ = ["ENCODINGS", "HOOKS", "PLUGINS", "REGISTRY", "ModelDims", "PositionEncoding", "PositionRangeError",
           "build_encoding", "check_plugins", "encoding_class", "plugin_config", "register", "register_plugin",
           "saved_options"]
