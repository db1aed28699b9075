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
from posbench.errors import PosbenchError
from posbench.train.optim import lr_lambda

pytestmark = pytest.mark.slow


@pytest.fixture
def parent(smoke_rope_run):
    """A finished smoke run of rope (train_len 32), shared with other files: read only."""
    return smoke_rope_run


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
    assert "4 added parameters" in normed.stderr + normed.stdout  # q_norm and k_norm gains of 2 layers
    from omegaconf import OmegaConf

    for run in ("drope", "qk"):
        child = OmegaConf.load(tmp_path / run / "config.yaml")
        assert child.train.init_hash == config_hash(OmegaConf.load(parent / "config.yaml"))
        rows = pd.read_csv(tmp_path / run / "results.csv")
        assert set(rows.encoding) == {"nope"} and (rows.status == "ok").all() and rows.ppl.notna().all()
        assert (rows.init_len == 32).all()  # the parent's train_len beside the run's own
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
    assert "trained another network or corpus: model.n_layers (2 there, 3 here)" in bad.stderr
    assert not (tmp_path / "x").exists()
    missing = posbench("train", *SMOKE, f"train.init_from={tmp_path / 'nothing'}", f"hydra.run.dir={tmp_path / 'y'}",
                       check=False)
    assert missing.returncode == 2 and "is not a trained posbench run dir" in missing.stderr
    both = posbench("train", *SMOKE, f"train.init_from={parent}", "train.schedule=wsd", f"train.branch_from={parent}",
                    f"hydra.run.dir={tmp_path / 'z'}", check=False)
    assert both.returncode == 2 and "train.init_from and train.branch_from both name a run" in both.stderr


def test_init_len_is_filled_in_from_the_parent_and_hashes_nothing(parent):
    from posbench.train.finetune import set_parent_hash

    cfg = compose(*SMOKE, "encoding=rope", f"train.init_from={parent}", "train.train_len=64")
    before = config_hash(cfg)
    set_parent_hash(cfg)
    assert cfg.train.init_len == 32 and cfg.train.init_hash is not None
    without = cfg.copy()
    without.train.init_len = None
    assert config_hash(cfg) == config_hash(without) != before  # the parent's hash, not its length, is hashed
    with pytest.raises(PosbenchError, match=r"^train.init_len=32 is filled in from train.init_from"):
        set_parent_hash(compose(*SMOKE, "+train.init_len=32"))


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


def test_a_scaling_in_training_rotates_as_its_formula_relative_to_the_parent_length():
    """rope with encoding.trained_scaling=pi, original_len 8, at train_len 32: a window of 32 rotates
    position p by p / 4 (s = 32 / 8); yarn's frequencies and factor are YaRN's over 8 positions."""
    from posbench.encodings import ModelDims, build_encoding
    from posbench.methods import yarn_attention_factor, yarn_inv_freq

    dims = ModelDims(d_model=32, n_heads=2, n_layers=1, train_len=32)
    q, k, pos = torch.randn(1, 2, 32, 16), torch.randn(1, 2, 32, 16), torch.arange(32)
    pi = build_encoding({"name": "rope", "trained_scaling": "pi", "original_len": 8}, dims)
    angles = (pos.double() / 4)[:, None] * 10000.0 ** (-torch.arange(0, 16, 2).double() / 16)
    cos, sin = torch.cat([angles.cos()] * 2, -1).float(), torch.cat([angles.sin()] * 2, -1).float()
    half = lambda x: torch.cat((-x[..., 8:], x[..., :8]), -1)  # noqa: E731  (pairing half)
    torch.testing.assert_close(pi.rotate(q, k, pos, 0)[0], q * cos + half(q) * sin, rtol=1e-5, atol=1e-5)
    yarn = build_encoding({"name": "rope", "trained_scaling": "yarn", "trained_factor": 4.0, "original_len": 8}, dims)
    torch.testing.assert_close(yarn.inv_freq(*yarn.resolved_scaling(32)), yarn_inv_freq(16, 10000.0, 4.0, 8))
    c, s = yarn.angle_table(pos, *yarn.resolved_scaling(32))
    torch.testing.assert_close((c ** 2 + s ** 2).sqrt(), torch.full_like(c, yarn_attention_factor(4.0)))
    plain = build_encoding({"name": "rope"}, dims)  # no scaling: as before the option existed
    assert plain.resolved_scaling(32) == ("none", 1.0) and plain.reference_len == 32 and plain.original_len is None


def test_an_extension_run_starts_at_its_parent_with_the_scaling_active_in_training(parent, tmp_path):
    """From the rope parent (train_len 32) to train_len 64 under yarn relative to 32, at a vanishing
    learning rate: at L=32 (s = 1) the child's ppl is the parent's; its training loss at 64 differs
    from the same child without the scaling (the scaling is active in training)."""
    common = (*SMOKE, "encoding=rope", f"train.init_from={parent}", "train.lr=1e-12", "train.steps=5",
              "train.log_every=1", "train.train_len=64", "eval.lengths=[32,64,128]")
    posbench("train", *common, "encoding.trained_scaling=yarn", "encoding.original_len=32", f"hydra.run.dir={tmp_path / 'yarn'}")
    posbench("train", *common, f"hydra.run.dir={tmp_path / 'plain'}")
    assert ppl(tmp_path / "yarn")[32] == pytest.approx(ppl(parent)[32], rel=1e-5)
    assert ppl(tmp_path / "plain")[32] == pytest.approx(ppl(parent)[32], rel=1e-5)
    first = [json.loads(_lines(tmp_path / run / "metrics.jsonl")[0])["loss"] for run in ("yarn", "plain")]
    assert abs(first[0] - first[1]) > 1e-5  # yarn at s = 2 moves the loss (by about 5e-4); rounding, by 1e-6 at most
    rows = pd.read_csv(tmp_path / "yarn" / "results.csv")
    assert (rows.train_len == 64).all() and (rows.init_len == 32).all() and (rows.status == "ok").all()
    bad = posbench("train", *SMOKE, "encoding=rope", "encoding.trained_scaling=pi2", f"hydra.run.dir={tmp_path / 'bad'}",
                   check=False)
    assert bad.returncode == 2 and "encoding.trained_scaling='pi2' is not valid; valid choices: none, pi" in bad.stderr


def test_a_learned_table_grows_by_interpolating_its_positions():
    """Row p of the longer table is the shorter one at p n / rows, linear between neighbours."""
    from posbench.encodings.absolute import interpolate_rows

    table = torch.tensor([[0.0, 10.0], [2.0, 20.0], [4.0, 40.0], [8.0, 80.0]])
    grown = interpolate_rows(table, 8)  # p / 2: 0, 0.5, 1, ..., 3.5 (past the last row: the last row)
    want = torch.tensor([[0, 10], [1, 15], [2, 20], [3, 30], [4, 40], [6, 60], [8, 80], [8, 80]], dtype=torch.float)
    torch.testing.assert_close(grown, want)
    torch.testing.assert_close(interpolate_rows(table, 6)[3], table[2])  # 3 x 4 / 6 = 2: a row of its own


def test_a_learned_run_extended_to_twice_its_length_starts_from_its_interpolated_table(tmp_path):
    parent, child = tmp_path / "learned", tmp_path / "child"
    posbench("train", *SMOKE, "encoding=learned", f"hydra.run.dir={parent}")
    proc = posbench("train", *SMOKE, "encoding=learned", f"train.init_from={parent}", "train.train_len=64",
                    "train.lr=1e-12", "train.steps=2", "eval.lengths=[64]", f"hydra.run.dir={child}")
    assert "encoding.table.weight (32, 64) -> (64, 64)" in proc.stderr + proc.stdout
    from posbench.encodings.absolute import interpolate_rows

    before = torch.load(parent / "checkpoints/last.pt", weights_only=False)["model"]["encoding.table.weight"]
    after = torch.load(child / "checkpoints/last.pt", weights_only=False)["model"]["encoding.table.weight"]
    torch.testing.assert_close(after, interpolate_rows(before, 64), rtol=0, atol=1e-6)  # lr 1e-12: as loaded
    # a shorter table cannot be made from a longer one: one line, as for any parameter of another shape
    bad = posbench("train", *SMOKE, "encoding=learned", f"train.init_from={child}", "train.train_len=32",
                   f"hydra.run.dir={tmp_path / 'bad'}", check=False)
    assert bad.returncode == 2 and "encoding.table.weight" in bad.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "bad").exists()
