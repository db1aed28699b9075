"""Every config group composes; the CLI's help and command dispatch work."""

from pathlib import Path

import pytest

from conftest import compose, posbench
from posbench.build import build_model
from posbench.cli import conf_dir
from posbench.config import DataConfig, EvalConfig, TrainConfig, config_hash, model_config, typed

GROUPS = sorted(p.name for p in conf_dir().iterdir() if p.is_dir() and p.name != "probe")  # probe: eval only, tests/test_probe.py


@pytest.mark.parametrize("group, option", [(g, p.stem) for g in GROUPS
                                           for p in sorted((conf_dir() / g).glob("*.yaml"))])
def test_every_config_group_composes(group, option):
    cfg = compose(f"{group}={option}")
    typed(TrainConfig, cfg.train, "train")
    typed(EvalConfig, cfg.eval, "eval")
    typed(DataConfig, cfg.data, "data")
    model_config(cfg.model)
    if group in ("encoding", "model", "experiment"):
        model = build_model(cfg, vocab_size=300)
        assert model.encoding.name == cfg.encoding.name


def test_config_hash_ignores_seed_and_eval_only():
    base = config_hash(compose())
    assert config_hash(compose("seed=3", "eval.max_tokens=4096", "wandb.mode=offline")) == base
    assert config_hash(compose("train.lr=0.002")) != base
    assert config_hash(compose("encoding=rope")) != base


def test_eval_lengths_default_to_multiples_of_train_len():
    cfg = compose("train.train_len=64")
    assert typed(EvalConfig, cfg.eval, "eval").resolve_lengths(64) == [64, 128, 256, 512, 1024]


def test_help_and_encodings_list():
    out = posbench("--help").stdout
    assert "posbench [-m] <command>" in out and "report" in out
    train_help = posbench("train", "--help").stdout
    assert "posbench train" in train_help and "encoding: " in train_help
    listing = posbench("encodings").stdout.splitlines()
    names = [line.split()[0] for line in listing]
    assert {"sinusoidal", "learned", "rope", "alibi", "t5", "nope"} <= set(names)
    assert all(len(line.split()) > 3 for line in listing)  # each has a description


def test_unknown_command():
    proc = posbench("trian", check=False)
    assert proc.returncode == 2 and "unknown command 'trian'; valid choices: train, eval, report, encodings" in proc.stderr


def test_conf_ships_in_package_data():
    """The wheel maps conf/ to posbench/conf (pyproject), so the installed CLI finds it."""
    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert '"posbench.conf" = "conf"' in text
    assert (conf_dir() / "app_train.yaml").is_file()


def test_readme_set_up_commands_match_ci():
    """CI runs exactly the README's second set-up command; both pin the CPU torch build."""
    root = Path(__file__).parents[1]
    readme = [line for line in (root / "README.md").read_text().splitlines() if line.startswith("python3 -m venv")]
    assert len(readme) == 2 and all("torch==2.13.0" in line for line in readme)
    assert readme[0].endswith("posbench train encoding=alibi")
    assert readme[1] in (root / ".ci" / "run").read_text()


@pytest.mark.parametrize("schema, key", [("eval", "lengths"), ("eval", "multiples"), ("probe", "lengths"),
                                         ("probe", "multiples"), ("probe", "depths")])
def test_an_empty_list_of_lengths_is_an_error_naming_the_valid_forms(schema, key):
    from posbench.errors import PosbenchError
    from posbench.probe import PasskeyConfig

    with pytest.raises(PosbenchError, match=rf"^probe.depths is empty|^{schema}.{key}=\[\] is empty; valid: "):
        (EvalConfig if schema == "eval" else PasskeyConfig)(**{key: []})
