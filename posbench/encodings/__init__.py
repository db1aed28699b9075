"""Position encodings: one registry from name to class. See :mod:`.base` for the hooks.

Every module in this package is imported here, so adding an encoding is one class
decorated with ``@register`` in a module of this package, plus ``conf/encoding/<name>.yaml``.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

from ..errors import PosbenchError
from .base import HOOKS, REGISTRY, ModelDims, PositionEncoding, PositionRangeError, register

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")  # each module registers its encodings


@register
class NoPE(PositionEncoding):
    name = "nope"
    paper = "Haviv et al. 2022; Kazemnejad et al. 2023 (NoPE)"
    description = "no position information; causal masking alone orders tokens"
    reads_positions = False


def build_encoding(cfg: Mapping[str, Any], dims: ModelDims) -> PositionEncoding:
    """Instantiate ``cfg['name']`` with the remaining keys as keyword arguments."""
    params = dict(cfg)
    name = params.pop("name", None)
    if name not in REGISTRY:
        raise PosbenchError(f"unknown encoding {name!r}; valid choices: {', '.join(sorted(REGISTRY))}")
    cls = REGISTRY[name]
    unknown = sorted(set(params) - set(cls.params()))
    if unknown:
        raise PosbenchError(f"encoding {name!r} has no option {unknown[0]!r}; "
                       f"its options: {', '.join(cls.params()) or '(none)'}")
    return cls(dims, **params)


def saved_options(cfg: Mapping[str, Any]) -> dict:
    """A saved run's encoding config with the former default of every option it does not name
    (``former_defaults``): a run trained before ``t5.bias_scale`` existed was unscaled, and is
    rebuilt so. Unknown names pass through for :func:`build_encoding` to reject."""
    cls = REGISTRY.get(cfg.get("name"))
    return {**(cls.former_defaults if cls else {}), **cfg}


__all__ = ["HOOKS", "REGISTRY", "ModelDims", "PositionEncoding", "PositionRangeError",
           "build_encoding", "register", "saved_options"]
