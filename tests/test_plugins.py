"""Encodings, tasks and probes from outside the package (examples/): found by an installed
package's entry point and by a user config dir's ``_target_``; they train, evaluate in a fresh
process and report, under every launcher, and a missing or clashing plugin is one line."""

import importlib.util
import json
import re
import subprocess
import sys

import pandas as pd
import pytest
from conftest import ROOT, SMOKE, fake_distribution, posbench
from omegaconf import OmegaConf

from posbench.config import config_hash

pytestmark = pytest.mark.slow

EXAMPLE = ROOT / "examples" / "posbench-example"
CONFIG_DIR = ROOT / "examples" / "config"
QUICK = SMOKE + ["train.steps=6", "train.log_every=3", "train.ckpt_every=6", "eval.multiples=[1,4]",
                 "eval.max_tokens=256"]
TINY_TASK = ["model=task", "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_layers=1", "device=cpu",
             "train.batch_size=8", "train.steps=6", "train.warmup_steps=2", "train.log_every=3", "task.train_size=4",
             "task.eval_instances=12", "task.eval_batch=6", "task.eval_multiples=[1,2]", "encoding=nope"]


@pytest.fixture(scope="session")
def installed(tmp_path_factory):
    """The example package installed by pip into a directory of its own (put on PYTHONPATH by
    each command), as `pip install examples/posbench-example` would install it into a venv."""
    target = tmp_path_factory.mktemp("site")
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *isolation, "--target",
                    str(target), str(EXAMPLE)], check=True, capture_output=True, timeout=300)
    assert (target / "posbench_example" / "encodings.py").is_file()
    return {"PYTHONPATH": str(target)}


def test_an_entry_point_encoding_trains_evaluates_in_a_new_process_and_reports(tmp_path, installed):
    run = tmp_path / "run"
    proc = posbench("train", *QUICK, "encoding=logdist", "encoding.init_scale=0.5", f"hydra.run.dir={run}",
                    env=installed)
    assert "| logdist | 32 | 128 |" in proc.stdout
    saved = OmegaConf.load(run / "config.yaml")
    assert saved.encoding == {"name": "logdist", "_target_": "posbench_example.encodings.LogDistanceBias",
                              "_package_": "posbench-example==0.1.0", "init_scale": 0.5, "learned": True}
    plain = OmegaConf.to_container(saved, resolve=True)
    del plain["encoding"]["_target_"], plain["encoding"]["_package_"]
    assert config_hash(saved) == config_hash(OmegaConf.create(plain))  # import information is not hashed
    versions = json.loads((run / "versions.json").read_text())
    assert versions["encoding_plugin"]["package"] == "posbench-example==0.1.0" and versions["posbench"]
    rows = pd.read_csv(run / "results.csv")
    assert (rows.status == "ok").all() and rows.config_hash.nunique() == 1
    posbench("eval", f"checkpoint={run}", "device=cpu", "eval.lengths=[32,256]", "eval.max_tokens=256", env=installed)
    again = pd.read_csv(run / "results.csv").set_index("eval_len")
    assert again.loc[256, "status"] == "ok" and again.loc[32, "ppl"] == rows.set_index("eval_len").loc[32, "ppl"]
    report = posbench("report", run, "--out", tmp_path / "report", env=installed)
    assert "logdist" in report.stdout and (tmp_path / "report" / "report.png").is_file()
    # without the plugin: one line naming the module and what to do
    missing = posbench("eval", f"checkpoint={run}", "device=cpu", "eval.lengths=[64]", check=False,
                       env={"PYTHONPATH": None})
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [missing.stderr.strip()]
    assert "encoding 'logdist' needs module 'posbench_example'" in missing.stderr
    assert "install the package that provides it" in missing.stderr


@pytest.mark.parametrize("how", ["--config-dir", "hydra.searchpath"])
def test_a_config_dir_encoding_named_by_target_trains_and_evaluates(tmp_path, installed, how):
    run = tmp_path / "run"
    where = ["--config-dir", CONFIG_DIR] if how == "--config-dir" else [f"hydra.searchpath=[file://{CONFIG_DIR}]"]
    posbench("train", *where, *QUICK, "encoding=scaled_sinusoidal", f"hydra.run.dir={run}", env=installed)
    assert OmegaConf.load(run / "config.yaml").encoding._target_ == "posbench_example.encodings.ScaledSinusoidal"
    posbench("eval", f"checkpoint={run}", "device=cpu", "eval.lengths=[64]", "eval.max_tokens=256", env=installed)
    assert 64 in set(pd.read_csv(run / "results.csv").eval_len)


@pytest.mark.parametrize("launcher", ["basic", "local_parallel", "submitit_local"])
def test_plugins_run_under_every_launcher(tmp_path, installed, launcher):
    """A sweep of two plugin encodings (one an entry point, one a config-dir file) under each
    launcher: every job's rows are in its own run dir, and the report reads the sweep's rows
    whichever process wrote them."""
    sweep = tmp_path / "sweep"
    extra = ["hydra.launcher.timeout_min=10"] if launcher == "submitit_local" else []
    posbench("-m", "train", "--config-dir", CONFIG_DIR, *QUICK, "eval.multiples=[1]", "encoding=logdist,scaled_sinusoidal",
             f"hydra/launcher={launcher}", *extra, f"hydra.sweep.dir={sweep}", env=installed)
    assert sorted(p.parent.parent.name for p in sweep.rglob("results.csv")) == ["logdist", "scaled_sinusoidal"]
    posbench("report", sweep, "--no-reference", env=installed)
    assert sorted(pd.read_csv(sweep / "report.csv").encoding.unique()) == ["logdist", "scaled_sinusoidal"]


def test_listing_and_the_conformance_command(installed):
    listing = posbench("encodings", "--config-dir", CONFIG_DIR, env=installed).stdout
    assert "(plugin: entry point of posbench-example==0.1.0)" in listing
    assert "(plugin: _target_ posbench_example.encodings.ScaledSinusoidal)" in listing
    assert "alibi " in listing and "(plugin" not in listing.split("alibi ")[1].splitlines()[0]
    check = posbench("check", "posbench_example.encodings:LogDistanceBias", env=installed)
    assert check.stdout.strip().splitlines()[-1] == "logdist: 7 of 7 checks passed"
    one = posbench("check", "logdist", "init_scale=2.0", "--only", "causality,relative", env=installed)
    assert one.stdout.splitlines() == ["ok    causality", "ok    relative", "logdist: 2 of 2 checks passed"]


def test_a_plugin_with_a_builtin_name_is_one_line(tmp_path, installed):
    """An entry point named like a built-in, and a config-dir file named like one, are refused."""
    site = fake_distribution(tmp_path / "site", "clash", "0.1",
                             "[posbench.encodings]\nalibi = posbench_example.encodings:LogDistanceBias\n")
    env = {"PYTHONPATH": f"{site}:{installed['PYTHONPATH']}"}
    clash = ("encoding plugin 'alibi' (posbench_example.encodings.LogDistanceBias, entry point of clash==0.1) "
             "has the name of the built-in encoding 'alibi'")
    proc = posbench("train", *QUICK, "encoding=alibi", f"hydra.run.dir={tmp_path / 'run'}", check=False, env=env)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert clash in proc.stderr
    assert not (tmp_path / "run").exists()
    listing = posbench("encodings", env=env).stdout  # the listing names it as broken and lists the rest
    assert re.search(r"^alibi +broken +" + re.escape(clash), listing, re.M) and re.search(r"^rope +rotate ", listing, re.M)
    configs = tmp_path / "configs" / "encoding"
    configs.mkdir(parents=True)
    (configs / "rope.yaml").write_text("name: rope\n_target_: posbench_example.encodings.LogDistanceBias\n")
    proc = posbench("train", "--config-dir", configs.parent, *QUICK, "encoding=rope", check=False, env=installed)
    assert proc.returncode == 2 and "has the name of posbench's built-in encoding 'rope'" in proc.stderr


def test_an_entry_point_task_and_a_config_dir_task_train_with_their_own_options(tmp_path, installed):
    run = tmp_path / "increment"
    proc = posbench("train", *TINY_TASK, "task=increment", "task.step=3", f"hydra.run.dir={run}", env=installed)
    assert "| increment | nope | 4 | 1x |" in proc.stdout
    saved = OmegaConf.load(run / "config.yaml")
    assert saved.task._target_ == "posbench_example.tasks.Increment" and saved.task.step == 3
    assert saved.train.train_len == 4 + 5 + 3  # <bos> 4 digits <sep> 5 digits <eos>, less the last token
    rows = pd.read_csv(run / "tasks.csv")
    assert list(rows.eval_size) == [4, 8] and (rows.task == "increment").all()
    versions = json.loads((run / "versions.json").read_text())
    assert versions["task_plugin"]["package"] == "posbench-example==0.1.0"
    report = posbench("report", run, "--out", tmp_path / "report", env={"PYTHONPATH": None})  # no plugin needed
    assert "increment" in report.stdout and (tmp_path / "report" / "tasks.png").is_file()
    run = tmp_path / "add_constant"
    posbench("train", "--config-dir", CONFIG_DIR, "task=add_constant", *TINY_TASK, f"hydra.run.dir={run}",
             env=installed)
    saved = OmegaConf.load(run / "config.yaml")
    assert saved.task.name == "add_constant" and saved.task.step == 7
    assert set(pd.read_csv(run / "tasks.csv").task) == {"add_constant"}
    bad = posbench("train", *TINY_TASK, "task=increment", "+task.width=3", check=False, env=installed)
    assert bad.returncode == 2 and "task.width is not an option of task 'increment'" in bad.stderr
    assert "step" in bad.stderr.strip().splitlines()[-1]


def test_probes_from_an_entry_point_and_a_config_dir_evaluate_a_run_and_report(tmp_path, installed):
    run = tmp_path / "run"
    posbench("train", *QUICK, "encoding=alibi", f"hydra.run.dir={run}", env=installed)
    proc = posbench("eval", f"checkpoint={run}", "probe=repeat", "probe.multiples=[1,2]", env=installed)
    assert "| alibi | 32 |" in proc.stdout and "repeat.csv" in proc.stdout
    rows = pd.read_csv(run / "repeat.csv")
    assert list(rows.length) == [32, 64] and (rows.status == "ok").all() and rows.accuracy.between(0, 1).all()
    assert list(rows.columns[:5]) == ["encoding", "rope_scaling", "train_len", "seed", "length"]
    assert (run / "repeat.png").is_file()  # drawn at eval time
    posbench("eval", "--config-dir", CONFIG_DIR, f"checkpoint={run}", "probe=repeat_far", env=installed)
    assert list(pd.read_csv(run / "repeat_far.csv").length) == [64, 256]
    index = json.loads((run / "probes.json").read_text())
    assert index["repeat_far"]["_target_"] == "posbench_example.probes.Repeat"
    assert index["repeat_far"]["options"]["trials"] == 8
    report = posbench("report", run, "--out", tmp_path / "report", env=installed)
    assert {"repeat.png", "repeat_far.png"} <= {p.name for p in (tmp_path / "report").iterdir()}
    svg = (tmp_path / "report" / "repeat_far.svg").read_text()
    assert 'id="repeat_far:alibi"' in svg and "report.md" in report.stdout
    # without the plugin package: its rows still report; asking for the probe is one line
    posbench("report", run, "--out", tmp_path / "bare", env={"PYTHONPATH": None})
    assert (tmp_path / "bare" / "repeat.png").is_file()
    missing = posbench("eval", f"checkpoint={run}", "probe=repeat", check=False, env={"PYTHONPATH": None})
    assert missing.returncode == 2 and missing.stderr.strip() == ("posbench: error: unknown probe 'repeat'; valid choices: "
                                                                   "niah_multikey, niah_multivalue, passkey, variable_tracking")
