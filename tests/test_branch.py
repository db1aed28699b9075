"""Warmup-stable-decay and branching: the schedule against its formula, cosine runs keeping their
config hash, and a run branched off a longer run's stable phase ending bit for bit where the
same run trained from scratch ends (on a slice of the real corpus), plus the branch's errors."""

import math

import pytest
import torch

from conftest import SMOKE, compose, posbench
from posbench.config import TrainConfig, config_hash
from posbench.errors import PosbenchError
from posbench.train.configure import train_config
from posbench.train.loop import train
from posbench.train.optim import lr_lambda


def test_wsd_holds_the_peak_then_cools_down_along_one_minus_sqrt():
    tcfg = TrainConfig(steps=100, warmup_steps=10, schedule="wsd", decay_frac=0.2, min_lr_ratio=0.1)
    f = lr_lambda(tcfg)
    assert tcfg.decay_start() == 80
    assert [f(s) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert all(f(s) == 1.0 for s in range(10, 81))  # exactly the peak through the stable phase
    for s in (85, 90, 99, 100, 120):
        progress = min(1.0, (s - 80) / 20)
        assert f(s) == pytest.approx(1 - 0.9 * math.sqrt(progress))
    assert f(100) == pytest.approx(0.1)
    # cosine: the closed form, from the end of warmup
    c = lr_lambda(TrainConfig(steps=100, warmup_steps=10, min_lr_ratio=0.1))
    for s in (10, 37, 55, 99):
        assert c(s) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - 10) / 90)))


def test_cosine_runs_keep_their_hash_and_wsd_keys_count_only_under_wsd():
    base = compose(*SMOKE)
    assert config_hash(base) == config_hash(compose(*SMOKE, "train.decay_frac=0.5"))  # no effect under cosine
    assert config_hash(base) == config_hash(compose(*SMOKE, "train.save_steps=[10]", "train.branch_from=/x",
                                                   "train.schedule=cosine"))
    wsd = config_hash(compose(*SMOKE, "train.schedule=wsd"))
    assert wsd != config_hash(base) and wsd != config_hash(compose(*SMOKE, "train.schedule=wsd", "train.decay_frac=0.5"))


@pytest.mark.parametrize("overrides, message", [
    (["train.schedule=linear"], "train.schedule='linear' is not valid; valid choices: cosine, wsd, constant"),
    (["train.schedule=wsd", "train.decay_frac=0"], "train.decay_frac=0.0 is not valid; valid: a fraction in (0, 1]"),
    (["train.save_steps=[0]"], "train.save_steps has 0; valid: steps in 1..train.steps=30"),
    (["train.branch_from=/x"], "train.branch_from needs train.schedule=wsd (got 'cosine')"),
])
def test_bad_schedule_settings_are_refused(overrides, message):
    from posbench.config import typed

    with pytest.raises(PosbenchError) as e:
        typed(TrainConfig, compose(*SMOKE, *overrides).train, "train")
    assert str(e.value).startswith(message)


@pytest.mark.slow
def test_a_branch_ends_bit_for_bit_where_the_run_from_scratch_ends(tmp_path):
    wsd = [*SMOKE, "encoding=alibi", "train.schedule=wsd", "train.decay_frac=0.25", "train.ckpt_every=100"]
    # the short run (20 steps) decays from step 15; the long one (30 steps) keeps step 15
    long = train(train_config(compose(*wsd, "train.steps=30", "train.save_steps=[15]")), tmp_path / "long")
    assert (tmp_path / "long/checkpoints/step_15.pt").is_file() and long.rows is not None
    scratch = train(train_config(compose(*wsd, "train.steps=20")), tmp_path / "scratch")
    branch = train(train_config(compose(*wsd, "train.steps=20", f"train.branch_from={tmp_path / 'long'}")),
                   tmp_path / "branch")
    a = torch.load(tmp_path / "scratch/checkpoints/last.pt", weights_only=False)
    b = torch.load(tmp_path / "branch/checkpoints/last.pt", weights_only=False)
    assert a["step"] == b["step"] == 20 and a["config_hash"] == b["config_hash"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert scratch.rows.ppl.tolist() == branch.rows.ppl.tolist()
    assert scratch.rows.ppl.tolist() != long.rows.ppl.tolist()  # a real difference to detect

    # errors: another config, a source too short, a missing kept step; each one line, nothing written
    cases = [(["train.steps=20", "train.lr=0.002"], "is a run of another config: train.lr (0.001 there, 0.002 here); valid: a run "
                                                    "that differs only in train.steps"),
             (["train.steps=40"], "trains 30 steps, no more than this run's decay start (30)"),
             (["train.steps=24"], "has no checkpoint at step 18, this run's decay start (kept: 15); "
                                  "train it with train.save_steps including 18")]
    for i, (overrides, message) in enumerate(cases):
        run = tmp_path / f"bad{i}"
        proc = posbench("train", *wsd, *overrides, f"train.branch_from={tmp_path / 'long'}", f"hydra.run.dir={run}",
                        check=False)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith(f"posbench: error: train.branch_from="
                                                                f"'{tmp_path / 'long'}' {message}")
        assert not (run / "checkpoints").exists() and not (run / "results.csv").exists()
