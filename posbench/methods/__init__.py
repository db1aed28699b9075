"""Inference-time methods: one class each, registered by its ``method=`` (``eval.extension``) or
``eval.rope_scaling`` name.

:class:`Extension` (``posbench/methods/base.py``) is the base and the method that changes
nothing; the built-ins register themselves when their module is imported, here and only here,
every module of this package found by scanning it: :mod:`.regroup` (Self-Extend, ReRoPE),
:mod:`.scaled` (log-n, Llama 3's scaling), :mod:`.parts` (STRING, attention sinks, LM-Infinite,
Dual Chunk Attention). A built-in is its class in a module here and its options' defaults in
conf/method/NAME.yaml (``method=NAME method.OPTION=V``, :meth:`Extension.option_fields`):
nothing else names it. ``Extension("self_extend", 512, 8, train_len)`` builds the class
registered under that name; :func:`methods` lists them in order. How any method's attention is
computed: :mod:`posbench.encodings.extension`.

RoPE scalings (``eval.rope_scaling``: PI, NTK, dynamic NTK, YaRN, Llama 3's) are classes of
:mod:`.rope` (:class:`RopeScaling`), registered the same way and listed by :func:`scalings`;
:func:`scaling` names one. They set the frequencies, positions and scale of a rotation, for
posbench's rotary encodings and a pretrained model's rotary module alike; a method of
``eval.extension`` acts at the attention, beside a scaling where it says so
(:meth:`Extension.check_scaling`: ``yarn+logn``).

A method from outside the package is a subclass of :class:`Extension` declared with its name
(``class Mine(Extension, name="mine")``), found the ways encodings are (:mod:`posbench.plugins`):
an installed package's entry point in the group ``posbench.methods`` (``mine =
"my_package.methods:Mine"``), or its import path as the value (``eval.extension=my_package.methods:Mine``).
A scaling the same way, in the group ``posbench.rope_scalings`` (``eval.rope_scaling=pkg.module:Class``).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass

from ..config import SCALING_GROUP  # the entry-point group of RoPE scalings from other packages
from ..errors import PosbenchError
from .base import REGISTRY, Extension, Part, logn_factor, method_text
from .parts import STRING_FACTOR, STRING_LOCAL
from .rope import (
    LLAMA3_HIGH_FREQ_FACTOR,
    LLAMA3_LOW_FREQ_FACTOR,
    SCALING_REGISTRY,
    YARN_BETA_FAST,
    YARN_BETA_SLOW,
    RopeScaling,
    Rotation,
    llama3_inv_freq,
    ntk_base,
    rope_inv_freq,
    yarn_attention_factor,
    yarn_correction_dim,
    yarn_inv_freq,
    yarn_ramp,
)

for _module in pkgutil.iter_modules(__path__):  # every module here: the built-ins register themselves as imported,
    importlib.import_module(f"{__name__}.{_module.name}")  # so a new one is its module and conf/method/NAME.yaml

ORDER = ("none", "self_extend", "rerope", "logn", "llama3", "string", "sinks", "lm_infinite", "dca")


GROUP = "posbench.methods"  # the entry-point group of methods from other packages
_LOADED: set[str] = set()


def _load(group: str, registry: dict, base: type) -> None:
    """Register the classes of the installed packages' entry points in ``group`` (once)."""
    if group in _LOADED:
        return
    _LOADED.add(group)
    from ..plugins import entry_points

    for name, ep in entry_points(group).items():
        if name not in registry:
            register(ep.load(), name, f"entry point {name!r} = {ep.value!r} ({group})", registry, base)


def methods() -> dict[str, type[Extension]]:
    """Name -> class of every registered method: the built-ins in their documented order, then
    those of installed packages' entry points (loaded once) and any other subclass imported."""
    _load(GROUP, REGISTRY, Extension)
    return {**{name: REGISTRY[name] for name in ORDER if name in REGISTRY}, **REGISTRY}


def scalings() -> dict[str, type[RopeScaling]]:
    """Name -> class of every registered RoPE scaling (``eval.rope_scaling``), as :func:`methods`."""
    _load(SCALING_GROUP, SCALING_REGISTRY, RopeScaling)
    return dict(SCALING_REGISTRY)


def register(cls, name: str, what: str, registry: dict | None = None, base: type = Extension) -> type:
    """Register ``cls`` (a subclass of ``base``) under ``name`` in ``registry`` (the methods' by
    default); one line if it is not one."""
    registry = REGISTRY if registry is None else registry
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise PosbenchError(f"{what} is not a subclass of posbench.methods.{base.__name__}; valid: class "
                            f"Mine({base.__name__}, name='mine') with the hooks it changes")
    if registry.get(name) is not cls:
        if cls.__dict__.get("name") != name:
            cls.name = name
        registry[name] = cls
    return cls


def _lookup(value: str, found: dict, registry: dict, base: type, key: str) -> type:
    """The class named ``value`` in ``found``, or at the import path ``value`` (registered there)."""
    if value in found:
        return found[value]
    if ":" in value or "." in value:
        from ..plugins import import_target

        cls = import_target(value, f"{key}={value}")
        return register(cls, cls.__dict__.get("name") or cls.__name__.lower(), f"{key}={value}", registry, base)
    raise PosbenchError(f"{key}={value!r} is not valid; valid choices: {', '.join(found)}")


def method_class(method: str) -> type[Extension]:
    """The class of ``eval.extension=method``: a registered name, or an import path (``pkg.module:Class``)."""
    return _lookup(method, methods(), REGISTRY, Extension, "eval.extension")


def scaling(kind: str, key: str = "eval.rope_scaling") -> RopeScaling:
    """The scaling ``kind``: a registered name, or an import path; ``key``: the config key that
    names it, in its one-line error (``encoding.trained_scaling`` for a training's)."""
    return _lookup(kind, scalings(), SCALING_REGISTRY, RopeScaling, key)()


def scaling_factor(kind: str, factor: float | None, window_len: int, original_len: int) -> float:
    """s in effect for a window of ``window_len`` positions under scaling ``kind`` at
    ``eval.rope_factor`` = ``factor``: 1 for ``none``; max(1, window_len / original_len) for
    ``dynamic_ntk`` or when ``factor`` is None; else ``factor``."""
    return scaling(kind).factor(factor, window_len, original_len)


@dataclass(frozen=True)
class Applied:
    """What a results row ran at inference, as data: the RoPE ``scaling`` (``eval.rope_scaling``),
    the ``method`` (``method=`` / ``eval.extension``) and the method's two parameters, ``window``
    and ``group`` (``eval.extension_window`` / ``_group`` as the method resolved them: what each
    means is the method's, :attr:`Extension.options`; None where it has no such parameter).
    Rows carry it as the :attr:`COLUMNS`; :attr:`label` renders the name a person reads (and the
    rows' ``rope_scaling`` key): ``yarn``, ``self_extend(W=512,G=8)``, ``yarn+logn``."""

    scaling: str = "none"
    method: str = "none"
    window: int | None = None
    group: int | None = None

    COLUMNS = ("scaling", "method", "method_window", "method_group")

    @classmethod
    def of(cls, kind: str, ext: Extension) -> Applied:
        """The scaling ``kind`` (a registered name or an import path, named by its registered
        name) beside the method ``ext``, its parameters as ``ext`` resolved them."""
        named = [field for field, name in zip(("window", "group"), ext.params) if name]
        return cls(scaling(kind).name, ext.method, *(getattr(ext, f) if f in named else None
                                                     for f in ("window", "group")))

    @property
    def label(self) -> str:
        """The name rows are keyed and lines labelled by: the scaling, the method with its
        parameters named as its class names them (:attr:`Extension.params`), or both."""
        if self.method == "none":
            return self.scaling
        known, values = methods(), (self.window, self.group)
        params = known[self.method].params if self.method in known else ("window", "group")
        text = method_text(self.method, [n if v is not None else None for n, v in zip(params, values)], values)
        return text if self.scaling == "none" else f"{self.scaling}+{text}"

    def columns(self) -> dict:
        """The row's columns (:attr:`COLUMNS`) and its ``rope_scaling`` key, the :attr:`label`."""
        return {"rope_scaling": self.label, "scaling": self.scaling, "method": self.method,
                "method_window": self.window, "method_group": self.group}


__all__ = ["Applied", "Extension", "LLAMA3_HIGH_FREQ_FACTOR", "LLAMA3_LOW_FREQ_FACTOR", "Part", "RopeScaling",
           "Rotation", "STRING_FACTOR", "STRING_LOCAL", "YARN_BETA_FAST", "YARN_BETA_SLOW", "llama3_inv_freq",
           "logn_factor", "methods", "ntk_base", "rope_inv_freq", "scaling", "scaling_factor", "scalings",
           "yarn_attention_factor", "yarn_correction_dim", "yarn_inv_freq", "yarn_ramp"]
