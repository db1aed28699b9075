"""Inference-time methods: one class each, registered by its ``eval.extension`` name.

:class:`Extension` (``posbench/methods/base.py``) is the base and the method that changes
nothing; the built-ins register themselves when their module is imported here, and only here:
:mod:`.regroup` (Self-Extend, ReRoPE), :mod:`.scaled` (log-n, Llama 3's scaling), :mod:`.parts`
(STRING, attention sinks, LM-Infinite, Dual Chunk Attention). ``Extension("self_extend", 512, 8,
train_len)`` builds the class registered under that name; :func:`methods` lists them in order.
How any method's attention is computed: :mod:`posbench.encodings.extension`.

A method from outside the package is a subclass of :class:`Extension` declared with its name
(``class Mine(Extension, name="mine")``), found the ways encodings are (:mod:`posbench.plugins`):
an installed package's entry point in the group ``posbench.methods`` (``mine =
"my_package.methods:Mine"``), or its import path as the value (``eval.extension=my_package.methods:Mine``).
"""

from __future__ import annotations

from ..errors import PosbenchError
from . import parts, regroup, scaled  # noqa: F401 - the built-ins register themselves
from .base import REGISTRY, Extension, Part, logn_factor
from .parts import STRING_FACTOR, STRING_LOCAL
from .scaled import LLAMA3_HIGH_FREQ_FACTOR, LLAMA3_LOW_FREQ_FACTOR, llama3_inv_freq

ORDER = ("none", "self_extend", "rerope", "logn", "llama3", "string", "sinks", "lm_infinite", "dca")


GROUP = "posbench.methods"  # the entry-point group of methods from other packages
_LOADED: list[bool] = []


def methods() -> dict[str, type[Extension]]:
    """Name -> class of every registered method: the built-ins in their documented order, then
    those of installed packages' entry points (loaded once) and any other subclass imported."""
    if not _LOADED:
        _LOADED.append(True)
        from ..plugins import entry_points

        for name, ep in entry_points(GROUP).items():
            if name not in REGISTRY:
                register(ep.load(), name, f"entry point {name!r} = {ep.value!r} ({GROUP})")
    return {**{name: REGISTRY[name] for name in ORDER if name in REGISTRY}, **REGISTRY}


def register(cls, name: str, what: str) -> type[Extension]:
    """Register ``cls`` (a subclass of :class:`Extension`) under ``name``; one line if it is not one."""
    if not (isinstance(cls, type) and issubclass(cls, Extension)):
        raise PosbenchError(f"{what} is not a subclass of posbench.methods.Extension; valid: class Mine(Extension, "
                            "name='mine') with the hooks it changes")
    if REGISTRY.get(name) is not cls:
        if cls.__dict__.get("name") != name:
            cls.name = name
        REGISTRY[name] = cls
    return cls


def method_class(method: str) -> type[Extension]:
    """The class of ``eval.extension=method``: a registered name, or an import path (``pkg.module:Class``)."""
    found = methods().get(method)
    if found is not None:
        return found
    if ":" in method or "." in method:
        from ..plugins import import_target

        cls = import_target(method, f"eval.extension={method}")
        return register(cls, cls.__dict__.get("name") or cls.__name__.lower(), f"eval.extension={method}")
    raise PosbenchError(f"eval.extension={method!r} is not valid; valid choices: {', '.join(methods())}")


__all__ = ["Extension", "LLAMA3_HIGH_FREQ_FACTOR", "LLAMA3_LOW_FREQ_FACTOR", "Part", "STRING_FACTOR", "STRING_LOCAL",
           "llama3_inv_freq", "logn_factor", "methods"]
