"""``posbench encodings``: every encoding that loads (built-in, plugin, a config dir's), with its
hook, parameter counts and paper, then the plugins that do not load and why; then the model options."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import conf_dir
from ..errors import PosbenchError
from .hydra_apps import HYDRA_APPS
from .validate import check_plugin_yaml, existing_dirs

HELP = "list the available position encodings (built-in and plugins)"


def encoding_param_counts(names: list[str], broken: dict[str, str] | None = None) -> dict[str, dict[str, int]]:
    """Encoding name -> {'params', 'pos_params'} of the default model (``posbench train`` with no
    overrides but ``encoding=``: model tiny, the default corpus's vocabulary size data.vocab_size,
    train.train_len), built on the CPU without loading any data. (The meta device would allocate
    nothing but costs more here: its first use takes longer than the 21 small builds.) A plugin
    that cannot be built there goes to ``broken`` (name -> why) instead."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    from ..encodings import ENCODINGS, PLUGINS, plugin_config
    from ..model.build import build_model

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
    from ..encodings import encoding_class

    broken = {}
    for d in dirs:
        for path in sorted((d / "encoding").glob("*.yaml")):
            try:
                cfg = check_plugin_yaml(path)
                if cfg.get("_target_"):
                    encoding_class(cfg)
            except PosbenchError as e:
                broken[path.stem] = str(e) if str(path) in str(e) else f"{path}: {e}"
    return broken


def main(args: list[str]) -> None:
    """The listing: every encoding that loads, then one line per plugin that does not (an entry
    point whose module is gone, a config dir's file that does not parse), naming its package or
    file and the error, so one broken plugin hides neither the others nor itself."""
    from ..encodings import ENCODINGS, PLUGINS, REGISTRY
    from ..report.render import count_text

    parser = argparse.ArgumentParser(prog="posbench encodings", description=HELP)
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
    from ..config import MODEL_OPTIONS

    print("\nmodel options, with any encoding (posbench train encoding=E OPTION):")
    width = max(len(o) for o, _, _ in MODEL_OPTIONS)
    for option, description, paper in MODEL_OPTIONS:
        print(f"{option:<{width}}  {description}  [{paper}]")
    from ..methods import methods

    print("\ninference-time methods, on rotary runs and pretrained models (posbench eval ... method=NAME; "
          "eval.extension=NAME the older spelling):")
    found = {name: cls for name, cls in methods().items() if name != "none"}
    width = max(len(name) for name in found)
    for name, cls in found.items():
        letters = dict(zip(("window", "group"), cls.params))
        options = ", ".join(f"method.{option}={letters[field]}" for option, field in cls.option_fields().items())
        print(f"{name:<{width}}  {options or 'no options'}  [{cls.paper}]")
    from ..methods import scalings

    print("\nRoPE scalings, on rotary runs and pretrained models (posbench eval ... eval.rope_scaling=NAME; "
          "s: eval.rope_factor, default T / train_len per window):")
    found = {name: cls for name, cls in scalings().items() if name != "none"}
    width = max(len(name) for name in found)
    for name, cls in found.items():
        print(f"{name:<{width}}  {'s = T / train_len always' if cls.per_window else 'eval.rope_factor=s'}  "
              f"[{cls.paper}]")
