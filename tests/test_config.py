"""Every config group composes; the CLI's help and command dispatch work."""

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SMOKE, compose, posbench
from posbench.model.build import build_model
from posbench.config import DataConfig, EvalConfig, TrainConfig, conf_dir, config_hash, model_config, typed
from posbench.errors import PosbenchError

GROUPS = sorted(p.name for p in conf_dir().iterdir() if p.is_dir() and p.name not in ("probe", "study", "method"))
# probe, method: eval only (tests/test_probe.py, test_every_method_composes_into_the_eval_keys); study: files
# `posbench study` reads, not a Hydra group (tests/test_study.py)


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


@pytest.mark.parametrize("method", sorted(p.stem for p in (conf_dir() / "method").glob("*.yaml")))
def test_every_method_composes_into_the_eval_keys(method):
    """posbench eval's method=NAME (conf/method/NAME.yaml) with its options set becomes the
    eval.extension keys the evaluation reads (posbench.eval.subject.apply_method)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from posbench.eval.subject import apply_method
    from posbench.methods import method_class

    fields = method_class(method).option_fields()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            cfg = hydra_compose("app_eval", overrides=[f"method={method}",
                                                       *(f"method.{o}={5 + i}" for i, o in enumerate(fields))])
    finally:
        GlobalHydra.instance().clear()
    ecfg = typed(EvalConfig, apply_method(cfg).eval, "eval")
    assert ecfg.extension == method
    assert {field: getattr(ecfg, f"extension_{field}") for field in fields.values()} == {
        field: 5 + i for i, field in enumerate(fields.values())}


def test_config_hash_ignores_seed_and_eval_only():
    base = config_hash(compose())
    assert config_hash(compose("seed=3", "eval.max_tokens=4096", "wandb.mode=offline")) == base
    assert config_hash(compose("train.lr=0.002")) != base
    assert config_hash(compose("encoding=rope")) != base


def test_embed_scale_is_one_model_setting():
    """model.embed_scale: sqrt_d (the ALiBi paper's fairseq setup) for every encoding by default;
    a bad value is one line; a run's config.yaml from before the key keeps its encoding's old scale."""
    from omegaconf import open_dict

    for name in ("alibi", "rope", "sinusoidal", "learned"):
        assert build_model(compose(f"encoding={name}"), vocab_size=300).emb_scale == 16.0  # sqrt(256)
        assert build_model(compose(f"encoding={name}", "model.embed_scale=none"), vocab_size=300).emb_scale == 1.0
    with pytest.raises(PosbenchError, match=r"^model.embed_scale='yes' is not valid; valid choices: sqrt_d, none$"):
        model_config(compose("model.embed_scale=yes").model)
    for name, old_scale in (("sinusoidal", 16.0), ("learned", 16.0), ("alibi", 1.0), ("rope", 1.0)):
        cfg = compose(f"encoding={name}")
        with open_dict(cfg):
            del cfg.model["embed_scale"]
        assert build_model(cfg, vocab_size=300).emb_scale == old_scale


def test_eval_lengths_default_to_multiples_of_train_len():
    cfg = compose("train.train_len=64")
    assert typed(EvalConfig, cfg.eval, "eval").resolve_lengths(64) == [64, 128, 256, 512, 1024]


def test_help_and_encodings_list():
    out = posbench("--help").stdout
    assert "posbench [-m] <command>" in out and "report" in out
    train_help = posbench("train", "--help").stdout
    assert "posbench train" in train_help and "encoding: " in train_help
    listing = posbench("encodings").stdout.splitlines()
    assert listing[0].split()[:4] == ["encoding", "hook", "params", "position"]
    end = next(i for i, line in enumerate(listing) if line.startswith("(params"))
    rows = {line.split()[0]: line.split() for line in listing[1:end]}
    options = [line.split()[0] for line in listing[end + 1:] if line.startswith("model.")]
    assert options == ["model.length_scaling=logn", "model.length_scaling=ssmax", "model.qk_norm=true",
                       "model.window=W", "model.gate=elementwise", "model.differential=true",
                       "model.sinks=true", "model.layers=ddda", "model.layers=kkka", "model.layers=ma"]
    start = next(i for i, line in enumerate(listing) if line.startswith("inference-time methods"))
    scaling = next(i for i, line in enumerate(listing) if line.startswith("RoPE scalings"))
    methods = {line.split()[0]: line for line in listing[start + 1:scaling] if line.strip()}
    assert list(methods) == ["self_extend", "rerope", "logn", "llama3", "string", "sinks", "lm_infinite", "dca",
                            "leaky_rerope"]
    assert "method.window=W, method.group=G  [Jin et al. 2024" in methods["self_extend"]
    assert "method.shift=S, method.local=W  [An et al. 2024" in methods["string"]
    scalings = {line.split()[0]: line for line in listing[scaling + 1:] if line.strip()}
    assert list(scalings) == ["pi", "ntk", "dynamic_ntk", "yarn", "llama3"]
    assert "s = T / train_len always  [emozilla 2023" in scalings["dynamic_ntk"]
    assert {"sinusoidal", "learned", "rope", "alibi", "t5", "nope"} <= set(rows)
    assert all(len(r) > 5 for r in rows.values())  # each has counts and a description
    # the default model: tiny (D 256, 4 layers, d_ff 1024) and the default corpus's 8192 tokens
    d, ff, vocab = 256, 1024, 8192
    base = vocab * d + 4 * (4 * d * d + 4 * d + 2 * d * ff + ff + d) + 2 * d
    complex_tables = 3 * vocab * d // 2  # r, omega, theta: (V, D/2) each
    assert rows["alibi"][2:4] == [f"{base / 1e6:.2f}M", "0"]
    assert rows["complex"][2:4] == [f"{(base + complex_tables) / 1e6:.2f}M", f"{complex_tables / 1e6:.2f}M"]
    assert rows["t5"][2:4] == [f"{(base + 32 * 8) / 1e6:.2f}M", "256"]  # 32 buckets x 8 heads


def test_unknown_command():
    proc = posbench("trian", check=False)
    assert proc.returncode == 2 and "unknown command 'trian'; valid choices: train, eval, report, encodings" in proc.stderr


def test_conf_ships_in_the_wheel(tmp_path):
    """A real wheel holds conf/ as posbench/conf (every YAML file), so the installed CLI finds it,
    and the shipped baselines and published reference numbers as posbench/baselines and
    posbench/reference (`posbench report --baseline`, the paper panel): their tables, configs
    and block sums, not the figures of their reports."""
    import zipfile

    root = Path(__file__).parents[1]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(root)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("posbench-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("posbench/conf/")}
    expected = {f"posbench/conf/{p.relative_to(root / 'conf').as_posix()}" for p in (root / "conf").rglob("*.yaml")}
    assert "posbench/conf/app_train.yaml" in shipped and expected <= shipped
    assert (conf_dir() / "app_train.yaml").is_file()
    names = set(zipfile.ZipFile(wheel).namelist())
    data = {f"posbench/{p.relative_to(root / 'results').as_posix()}" for d in ("baselines", "reference")
            for p in (root / "results" / d).rglob("*") if p.suffix in (".csv", ".yaml", ".npz", ".md")}
    assert "posbench/reference/alibi_paper_L512.csv" in data and data <= names
    # every module of every package folder (pyproject lists the packages one by one)
    modules = {p.relative_to(root).as_posix() for p in (root / "posbench").rglob("*.py")}
    assert "posbench/model/transformer.py" in modules and modules <= names, sorted(modules - names)


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
    from posbench.eval.passkey import PasskeyConfig

    with pytest.raises(PosbenchError, match=rf"^probe.depths is empty|^{schema}.{key}=\[\] is empty; valid: "):
        (EvalConfig if schema == "eval" else PasskeyConfig)(**{key: []})


@pytest.mark.parametrize("cls, yaml", [("TrainConfig", "train/default.yaml"), ("EvalConfig", "eval/default.yaml"),
                                       ("ModelConfig", "model/tiny.yaml")])
def test_config_dataclass_defaults_equal_the_default_yaml(cls, yaml):
    """The typed configs' defaults repeat conf/: one value per key in both, so code that builds a
    config without Hydra (tests, tools, plugins) gets what `posbench train` gets."""
    import dataclasses

    from omegaconf import OmegaConf

    import posbench.config as config
    from posbench.config import conf_dir

    fields = {f.name: f for f in dataclasses.fields(getattr(config, cls))}
    declared = OmegaConf.to_container(OmegaConf.load(conf_dir() / yaml), resolve=False)
    differ = {}
    for key, value in declared.items():
        if key not in fields or (isinstance(value, str) and value.startswith("${")):
            continue  # interpolations (e.g. a length read from train.train_len) resolve per run
        f = fields[key]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if default != value:
            differ[key] = (default, value)
    assert differ == {}
    assert sorted(k for k in declared if k not in fields) == []


def test_compile_policy_compiles_where_it_was_measured_faster():
    """train.compile=auto (results/bench/compile.md): compiled only on a CPU with AMX training in
    bf16, for jobs of at least 200 steps; true and false are obeyed; tests stay eager."""
    import torch

    from posbench.config import TrainConfig
    from posbench.train.loop import AUTO_COMPILE_MIN_STEPS, compile_policy

    cpu, cuda, bf16 = torch.device("cpu"), torch.device("cuda"), torch.bfloat16
    assert AUTO_COMPILE_MIN_STEPS == 200 and TrainConfig().compile == "auto"
    assert compile_policy("auto", cpu, bf16, 400, amx=True)  # the default job on an AMX machine
    assert not compile_policy("auto", cpu, bf16, 40, amx=True)  # too short to pay for its compilation
    assert not compile_policy("auto", cpu, None, 400, amx=False)  # fp32 on AVX2: 1.01-1.03x, cancelled by compiling
    assert not compile_policy("auto", cpu, bf16, 400, amx=False)  # AVX512-BF16 without AMX: slower
    assert not compile_policy("auto", cuda, bf16, 400, amx=False)  # not measured
    assert compile_policy(True, cpu, None, 1, amx=False) and not compile_policy(False, cpu, bf16, 400, amx=True)
    smoke = compose(*SMOKE)  # what the tests train: eager on any machine
    assert not compile_policy(smoke.train.compile, cpu, bf16, int(smoke.train.steps), amx=True)
    with pytest.raises(PosbenchError, match=r"train.compile='yes' is not valid; valid choices: true, false, auto, graphs$"):
        TrainConfig(compile="yes")


def test_cuda_graphs_are_refused_off_cuda_before_a_run_dir_is_made(tmp_path):
    """train.compile=graphs (torch.compile's reduce-overhead mode) replays steps as CUDA graphs; a
    CPU would compile without them, and the rows would name a mode that did not run."""
    import torch

    from posbench.train.loop import compile_policy, execution

    assert compile_policy("graphs", torch.device("cuda"), torch.bfloat16, 1, amx=False)
    run = tmp_path / "run"
    proc = posbench("train", *SMOKE, "train.compile=graphs", f"hydra.run.dir={run}", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == ("posbench: error: train.compile=graphs replays steps as CUDA "
                                                    "graphs, which device=cpu has not; valid there: "
                                                    "train.compile=true, false or auto")
    assert not run.exists() or not any(run.iterdir())
    assert execution(torch.device("cuda"), torch.bfloat16, "graphs", environ={}) == "cuda bf16 graphs"
    assert execution(torch.device("cpu"), None, "eager", environ={"POSBENCH_FLEX": ""}) == "cpu fp32 eager"
    assert execution(torch.device("cuda"), torch.bfloat16, "compiled", environ={"POSBENCH_SDPA_BIAS": "cudnn"}) == \
        "cuda bf16 compiled, POSBENCH_SDPA_BIAS=cudnn"  # a kernel choice of the environment, named
