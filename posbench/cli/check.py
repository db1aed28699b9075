"""``posbench check ENCODING``: the conformance checks (:mod:`posbench.testing`) on a built-in, a
plugin, a config dir's encoding or a class named ``pkg.module:Class``, one line a check.

``posbench check model.KEY=VALUE ...`` (no encoding): the model options or layers named, checked with
each encoding of ``OPTION_ENCODINGS`` in turn (no position information, a rotation, a bias, a
decay), one line a check and encoding: a model option is held to the checks with every kind of
encoding it composes with."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import fail
from .validate import check_plugin_yaml, existing_dirs

HELP = ("run the conformance checks on an encoding (a name or pkg.module:Class), or on model options and layers "
        "(model.KEY=VALUE) with one encoding of each kind, or an inference-time method (method=NAME "
        "[method.OPTION=V], or eval.extension=NAME), as the zoo's tests do")
OPTION_ENCODINGS = ("nope", "rope", "alibi", "fox")  # what model options alone are checked with


def config_dir_encoding(name: str, dirs: list[Path]) -> tuple[type | None, dict]:
    """``posbench check --config-dir DIR NAME``: the class and options of ``DIR/encoding/NAME.yaml``
    (its ``_target_``, or the built-in it sets options of), or (None, {}) where no dir has it.
    Options that interpolate a run's keys (``${train.train_len}``) take the constructor's default."""
    from ..encodings import encoding_class
    from ..plugins import META_KEYS

    for d in dirs:
        path = d / "encoding" / f"{name}.yaml"
        if path.is_file():
            cfg = check_plugin_yaml(path)
            options = {k: v for k, v in cfg.items() if k != "name" and k not in META_KEYS
                       and not (isinstance(v, str) and "${" in v)}
            return encoding_class(cfg), options
    return None, {}


def main(args: list[str]) -> None:
    from ..model.conformance import CHECKS, check_encoding, resolve

    parser = argparse.ArgumentParser(prog="posbench check", description=HELP,
                                     epilog="checks: " + ", ".join(CHECKS) + " (posbench.testing; docs/extending.md)")
    parser.add_argument("encoding", help="a registered name, a config dir's encoding (--config-dir), the class as "
                                         "pkg.module:Class, or a model option model.KEY=VALUE (checked with "
                                         f"{', '.join(OPTION_ENCODINGS)})")
    parser.add_argument("options", nargs="*", metavar="KEY=VALUE",
                        help="constructor options (YAML values); model.KEY=VALUE: a model option to check with it "
                             "(e.g. model.length_scaling=ssmax)")
    parser.add_argument("--only", default=",".join(CHECKS), help="comma-separated checks to run (default: all)")
    parser.add_argument("--config-dir", "-cd", action="append", default=[], metavar="DIR",
                        help="read ENCODING from DIR/encoding/ENCODING.yaml: its _target_ (or built-in name) and "
                             "its options, which KEY=VALUE options override")
    ns = parser.parse_args(args)
    import yaml

    if ns.encoding.startswith("model."):  # model options alone: each checked with OPTION_ENCODINGS
        return check_model_options([ns.encoding, *ns.options], [c for c in ns.only.split(",") if c])
    if ns.encoding.startswith("eval.rope_scaling="):  # a RoPE scaling, held to the methods' checks
        only = None if ns.only == ",".join(CHECKS) else [c for c in ns.only.split(",") if c]
        return check_scaling_options([ns.encoding, *ns.options], only)
    if ns.encoding.startswith(("eval.extension=", "method=")):  # an inference-time method
        only = None if ns.only == ",".join(CHECKS) else [c for c in ns.only.split(",") if c]
        return check_method_options([ns.encoding, *ns.options], only)
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
        from ..config import model_config

        model_config(model)  # an unknown or bad model option is one line
    from ..config import check_options

    cls = cls or resolve(ns.encoding)
    check_options(cls, options, "encoding", cls.name or cls.__name__)  # names and types, as posbench train does
    checks = [c for c in ns.only.split(",") if c]
    failed = run_checks(checks, lambda check: check_encoding(cls, options, [check], model=model))
    print(f"{cls.name or cls.__name__}: {len(checks) - failed} of {len(checks)} checks passed")
    if failed:
        raise SystemExit(1)


def run_checks(names: list[str], run) -> int:
    """``run(name)`` for each check, one line each: ``ok`` or ``FAIL`` and the ConformanceError's
    message. -> how many failed."""
    from ..model.conformance import ConformanceError

    failed = 0
    for name in names:
        try:
            run(name)
            print(f"ok    {name}")
        except ConformanceError as e:
            failed += 1
            print(f"FAIL  {name}: {e}")
    return failed


def check_scaling_options(items: list[str], checks: list[str] | None) -> None:
    """``posbench check eval.rope_scaling=NAME [eval.rope_factor=s]``: the method checks
    (:data:`posbench.model.conformance.METHOD_CHECKS`) on a built-in, registered or import-path RoPE
    scaling (:class:`posbench.model.conformance.ScalingUnderCheck`), one line a check."""
    import yaml

    from ..methods import scaling
    from ..model.conformance import METHOD_CHECKS, ScalingUnderCheck, check_method

    keys = {"eval.rope_scaling": None, "eval.rope_factor": None}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or key not in keys:
            fail(f"option {item!r} is not one of {', '.join(f'{k}=...' for k in keys)}")
        keys[key] = value if key == "eval.rope_scaling" else yaml.safe_load(value)
    kind, factor = scaling(keys["eval.rope_scaling"]).name, keys["eval.rope_factor"]
    if factor is not None and not (isinstance(factor, (int, float)) and factor >= 1):
        fail(f"eval.rope_factor={factor!r} is not valid; valid: a factor >= 1, or null (T / train_len per window)")
    names = list(METHOD_CHECKS) if checks is None else checks
    failed = run_checks(names, lambda check: check_method(ScalingUnderCheck(kind, factor), checks=[check]))
    print(f"eval.rope_scaling={kind}: {len(names) - failed} of {len(names)} checks passed")
    if failed:
        raise SystemExit(1)


def check_method_options(items: list[str], checks: list[str] | None) -> None:
    """``posbench check method=NAME [method.OPTION=V ...]`` (or its older spelling ``eval.extension=NAME
    [eval.extension_window=W] [eval.extension_group=G]``): the method checks
    (:data:`posbench.model.conformance.METHOD_CHECKS`) on a built-in, registered or import-path
    method, one line a check."""
    import yaml
    from omegaconf import OmegaConf

    from ..eval.subject import apply_method
    from ..model.conformance import METHOD_CHECKS, check_method

    keys = {"eval.extension": None, "eval.extension_window": None, "eval.extension_group": None}
    method: dict = {}
    for item in items:
        key, eq, value = item.partition("=")
        if eq and key == "method":
            method["name"] = value
        elif eq and key.startswith("method.") and key.count(".") == 1:
            method[key.split(".")[1]] = yaml.safe_load(value)
        elif not eq or key not in keys:
            fail(f"option {item!r} is not one of {', '.join(f'{k}=...' for k in keys)}, method=NAME, "
                 "method.OPTION=...")
        else:
            keys[key] = value if key == "eval.extension" else yaml.safe_load(value)
    if method:  # method=NAME method.OPTION=V: the eval.extension keys it stands for
        cfg = OmegaConf.create({"method": {"name": "none", **method},
                                "eval": {k.split(".")[1]: v for k, v in keys.items()}})
        apply_method(cfg)
        keys = {f"eval.{k}": cfg.eval[k] for k in ("extension", "extension_window", "extension_group")}
    names = list(METHOD_CHECKS) if checks is None else checks
    failed = run_checks(names, lambda check: check_method(keys["eval.extension"], keys["eval.extension_window"],
                                                          keys["eval.extension_group"], [check]))
    print(f"method={keys['eval.extension']}: {len(names) - failed} of {len(names)} checks passed")
    if failed:
        raise SystemExit(1)


def check_model_options(items: list[str], checks: list[str]) -> None:
    """``posbench check model.KEY=VALUE ...``: the checks with each of ``OPTION_ENCODINGS``; an
    encoding the options refuse (a PosbenchError at build) is named and skipped."""
    import yaml

    from ..config import model_config
    from ..errors import PosbenchError
    from ..model.conformance import CHECKS, ConformanceError, check_encoding

    model = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.startswith("model."):
            fail(f"option {item!r} is not model.KEY=VALUE; valid: e.g. model.layers=ddda (after a model option, "
                 "only model options)")
        model[key.removeprefix("model.")] = yaml.safe_load(value)
    model_config(model)  # an unknown or bad model option is one line
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        fail(f"unknown check {unknown[0]!r}; valid choices: {', '.join(CHECKS)}")
    failed = passed = 0
    for name in OPTION_ENCODINGS:
        for check in checks:
            try:
                check_encoding(name, None, [check], model=model)
                passed += 1
                print(f"ok    {name:6s} {check}")
            except ConformanceError as e:
                failed += 1
                print(f"FAIL  {name:6s} {check}: {e}")
            except PosbenchError as e:
                print(f"skip  {name:6s} refused: {e}")
                break
    print(f"{' '.join(items)}: {passed} of {passed + failed} checks passed, with {', '.join(OPTION_ENCODINGS)}")
    if failed:
        raise SystemExit(1)
