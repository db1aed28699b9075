"""Fine-tuning from a finished run (posbench.train.finetune): the child starts where its parent
ended, DroPE drops RoPE (with and without QK-norm) and recalibrates, a cut-off child resumes
from its own checkpoint, and a parent of another network is one line, on the real corpus."""

import json
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

from conftest import SMOKE, compose, posbench
from posbench.config import TrainConfig, config_hash
from posbench.train.optim import lr_lambda

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """A finished smoke run of rope (train_len 32)."""
    run = tmp_path_factory.mktemp("parent") / "rope"
    posbench("train", *SMOKE, "encoding=rope", f"hydra.run.dir={run}")
    return run


def ppl(run):
    rows = pd.read_csv(run / "results.csv")
    return rows.set_index("eval_len").ppl


def test_a_child_at_a_vanishing_learning_rate_is_its_parent(parent, tmp_path):
    """Same encoding, lr 1e-12: the weights cannot move, so the child's ladder is the parent's."""
    child = tmp_path / "child"
    proc = posbench("train", *SMOKE, "encoding=rope", f"train.init_from={parent}", "train.lr=1e-12",
                    "train.steps=3", f"hydra.run.dir={child}")
    assert f"starting from the weights of {parent} (step 30" in proc.stderr + proc.stdout
    torch.testing.assert_close(torch.tensor(ppl(child).values), torch.tensor(ppl(parent).values), rtol=1e-5, atol=0)


def test_drope_drops_rope_and_recalibrates_with_and_without_qk_norm(parent, tmp_path):
    plain = posbench("train", *SMOKE, "encoding=nope", f"train.init_from={parent}", "train.schedule=constant",
                     "train.steps=10", f"hydra.run.dir={tmp_path / 'drope'}")
    assert "starting from the weights of" in plain.stderr + plain.stdout
    normed = posbench("train", *SMOKE, "encoding=nope", "model.qk_norm=true", f"train.init_from={parent}",
                      "train.schedule=constant", "train.steps=10", f"hydra.run.dir={tmp_path / 'qk'}")
    assert "8 added parameters" in normed.stderr + normed.stdout  # q_norm and k_norm gains of 4 layers
    from omegaconf import OmegaConf

    for run in ("drope", "qk"):
        child = OmegaConf.load(tmp_path / run / "config.yaml")
        assert child.train.init_hash == config_hash(OmegaConf.load(parent / "config.yaml"))
        rows = pd.read_csv(tmp_path / run / "results.csv")
        assert set(rows.encoding) == {"nope"} and (rows.status == "ok").all() and rows.ppl.notna().all()
    # recalibrated from rope's weights, not from scratch: far better than a fresh nope at 10 steps
    fresh = posbench("train", *SMOKE, "encoding=nope", "train.schedule=constant", "train.steps=10",
                     f"hydra.run.dir={tmp_path / 'fresh'}")
    assert fresh.returncode == 0
    assert ppl(tmp_path / "drope").iloc[0] < 0.8 * ppl(tmp_path / "fresh").iloc[0]


def test_a_cut_off_child_resumes_from_its_own_checkpoint(parent, tmp_path):
    """SIGTERM mid-training (a preemption) and the re-run: it resumes from its own checkpoint,
    not from the parent again, and ends where an uninterrupted child ends."""
    args = (*SMOKE, "encoding=nope", f"train.init_from={parent}", "train.steps=40")
    whole = tmp_path / "whole"
    posbench("train", *args, f"hydra.run.dir={whole}")
    cut = tmp_path / "cut"
    proc = subprocess.Popen([sys.executable, "-m", "posbench.cli", "train", *args, f"hydra.run.dir={cut}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not any(json.loads(line)["step"] >= 10 for line in _lines(cut / "metrics.jsonl")):
        assert proc.poll() is None and time.time() < deadline, "the child ended before step 10"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM and "interrupted at step" in err
    again = posbench("train", *args, f"hydra.run.dir={cut}")
    assert "resuming" in again.stderr and "starting from the weights" not in again.stderr + again.stdout
    torch.testing.assert_close(torch.tensor(ppl(cut).values), torch.tensor(ppl(whole).values), rtol=0, atol=0)


def _lines(path):
    text = path.read_text() if path.exists() else ""
    return [line for line in text.split("\n")[:-1] if line]


def test_a_parent_of_another_network_or_unfinished_is_one_line(parent, tmp_path):
    bad = posbench("train", *SMOKE, "encoding=nope", "model.n_layers=3", f"train.init_from={parent}",
                   f"hydra.run.dir={tmp_path / 'x'}", check=False)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "trained another network or corpus: model.n_layers (4 there, 3 here)" in bad.stderr
    assert not (tmp_path / "x").exists()
    missing = posbench("train", *SMOKE, f"train.init_from={tmp_path / 'nothing'}", f"hydra.run.dir={tmp_path / 'y'}",
                       check=False)
    assert missing.returncode == 2 and "is not a trained posbench run dir" in missing.stderr
    both = posbench("train", *SMOKE, f"train.init_from={parent}", "train.schedule=wsd", f"train.branch_from={parent}",
                    f"hydra.run.dir={tmp_path / 'z'}", check=False)
    assert both.returncode == 2 and "train.init_from and train.branch_from both name a run" in both.stderr


def test_constant_holds_the_peak_after_warmup_and_hashes_apart():
    f = lr_lambda(TrainConfig(steps=50, warmup_steps=5, schedule="constant"))
    assert [f(s) for s in (0, 4, 5, 30, 49, 60)] == pytest.approx([0.2, 1.0, 1.0, 1.0, 1.0, 1.0])
    base = compose(*SMOKE)
    assert config_hash(base) == config_hash(compose(*SMOKE, "train.init_from=null"))  # old runs keep their hash
    constant = config_hash(compose(*SMOKE, "train.schedule=constant"))
    assert constant != config_hash(base)
    assert constant == config_hash(compose(*SMOKE, "train.schedule=constant", "train.decay_frac=0.5"))
    # the parent's config hash counts (filled in by posbench train), not its path: seeds' children pool
    assert config_hash(compose(*SMOKE, "train.init_from=/a")) == config_hash(base)
    assert config_hash(compose(*SMOKE, "+train.init_hash=abc")) != config_hash(compose(*SMOKE, "+train.init_hash=abd"))
