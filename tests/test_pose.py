"""PoSE, positional skip-wise training (Zhu et al. 2024; ``train.pose_target``): the position ids
against the reference's rule written out again, the trainer handing them to every step, ordinary
positions at evaluation, the config hash, and bad values as one line."""

import pandas as pd
import pytest
import torch
from conftest import SMOKE, compose, posbench

from posbench.config import TrainConfig
from posbench.data.positions import pose_positions
from posbench.data.windows import mix
from posbench.errors import PosbenchError


def reference_rule(length: int, target: int, generator: torch.Generator) -> tuple[torch.Tensor, int, int]:
    """dwzhu-pku/PoSE ``train_preprocess_function_pose`` for one window whose text is contiguous,
    with Python's inclusive ``random.randint(a, b)`` drawn from ``generator`` -> (position ids,
    first chunk length rt1 - lt1, second chunk's skip rt). The reference's text draw (rt2) is not
    made: the window's tokens are not moved."""
    def randint(a, b):
        return int(torch.randint(a, b + 1, (1,), generator=generator))

    len_chunk = length
    lt1 = 0
    rt1 = randint(1, (len_chunk + 1) // 2)
    pos_ids = torch.arange(len_chunk, dtype=torch.long)
    lt = 0
    rt = randint(lt, target - len(pos_ids))
    pos_ids[:rt1 - lt1] += lt
    pos_ids[rt1 - lt1:] += rt
    return pos_ids, rt1 - lt1, rt


@pytest.mark.parametrize("length, target", [(32, 512), (33, 40), (128, 2048), (2, 3), (1, 5)])
def test_pose_positions_are_the_reference_rule_on_a_fixed_seed(length, target):
    ours, theirs = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    firsts, skips = set(), set()
    for _ in range(300):
        got = pose_positions(length, target, ours)
        want, first, skip = reference_rule(length, target, theirs)
        assert torch.equal(got, want)
        assert got.dtype == torch.long and got.shape == (length,)
        assert 1 <= first <= (length + 1) // 2 and 0 <= skip <= target - length  # chunk length, offset
        assert torch.equal(got[:first], torch.arange(first))  # chunk 0: u_0 = 0
        assert torch.equal(got[first:], torch.arange(first, length) + skip)  # chunk 1: shifted by u_1
        assert bool((got[1:] > got[:-1]).all()) and int(got.max()) < target  # monotone, below the target
        firsts.add(first)
        skips.add(skip)
    assert firsts == set(range(1, (length + 1) // 2 + 1))  # every chunk length the rule allows
    assert min(skips) <= (target - length) // 20 and max(skips) >= (target - length) * 19 // 20  # the whole range


def test_pose_positions_refuse_a_target_shorter_than_the_window():
    with pytest.raises(PosbenchError, match=r"^train.pose_target=16 cannot hold a window of 32 tokens; "
                                            r"valid: train.pose_target >= 32$"):
        pose_positions(32, 16, torch.Generator())


def test_train_pose_target_names_its_valid_range_in_one_line():
    assert TrainConfig().pose_target is None
    assert TrainConfig(train_len=128, pose_target=2048).pose_target == 2048
    for bad in (128, 64, 0, -1):
        with pytest.raises(PosbenchError, match=rf"^train.pose_target={bad} is not valid; valid: null \(positions "
                                                r"0..T-1\) or an integer > train.train_len=128 "):
            TrainConfig(train_len=128, pose_target=bad)
    with pytest.raises(PosbenchError, match=r"^train.pose_target=2048 and train.random_positions=2048 both set the "
                                            r"training positions; valid: one of them$"):
        TrainConfig(train_len=128, pose_target=2048, random_positions=2048)


def test_the_sampler_state_holds_the_windows_and_the_positions():
    """A checkpoint's sampler state restores both streams: the same batches and positions follow."""
    from posbench.config import run_config
    from posbench.train.workload import PoseSampler, make_workload

    rc = run_config(compose(*SMOKE, "encoding=rope", "train.pose_target=512"))
    sampler = make_workload(rc).sampler
    assert isinstance(sampler, PoseSampler)
    sampler()
    state = sampler.generator.get_state()
    x, y, pos = sampler()
    sampler()
    sampler.generator.set_state(state)
    x2, y2, pos2 = sampler()
    assert torch.equal(x, x2) and torch.equal(y, y2) and torch.equal(pos, pos2)
    with pytest.raises(PosbenchError, match="not that of a train.pose_target run"):
        sampler.generator.set_state(state[0])


def test_every_training_step_gets_the_pose_positions_and_evaluation_ordinary_ones(tmp_path, monkeypatch):
    """Steps 1..3 get pose_positions drawn from the run's PoSE stream; the windows are those of the
    run without the setting; the ladder afterwards calls the model with positions 0..T-1 (None),
    after the check before training, at positions ending at pose_target - 1."""
    import posbench.train.loop as loop
    from posbench.train.configure import train_config
    from posbench.model.transformer import LanguageModel
    from posbench.train.workload import POSE_SALT

    steps, evaluated = [], []
    step, hidden = loop.train_step, LanguageModel.hidden

    def recording_step(s, x, y, positions=None):
        steps.append((x.clone(), positions))
        return step(s, x, y, positions)

    def recording_hidden(self, idx, positions=None):
        if not self.training:
            evaluated.append(positions)
        return hidden(self, idx, positions)

    monkeypatch.setattr(loop, "train_step", recording_step)
    monkeypatch.setattr(LanguageModel, "hidden", recording_hidden)
    common = [*SMOKE, "encoding=rope", "train.steps=3", "eval.lengths=[32,64]", "train.compile=false"]
    loop.train(train_config(compose(*common, "train.pose_target=512")), tmp_path / "pose")
    generator = torch.Generator().manual_seed(mix(0, 0, salt=POSE_SALT))
    assert len(steps) == 3
    for x, positions in steps:
        assert torch.equal(positions, pose_positions(32, 512, generator))
    assert any(int(p.max()) > 31 for _, p in steps)  # skips beyond the window, not 0..T-1
    check, *ladder = evaluated  # the check before training reaches the largest id, 511
    assert torch.equal(check, torch.arange(480, 512))
    assert ladder and all(p is None for p in ladder)  # the ladder: ordinary positions

    windows = [x for x, _ in steps]
    steps.clear()
    loop.train(train_config(compose(*common)), tmp_path / "plain")
    assert all(torch.equal(a, b) for a, (b, p) in zip(windows, steps)) and all(p is None for _, p in steps)


def test_smoke_train_then_eval_and_a_probe_of_a_pose_run(tmp_path):
    """``posbench train encoding=rope train.pose_target=512 experiment=smoke``, then ``posbench eval``
    of its run and a passkey probe, which runs positions 0..T-1 and so takes a PoSE run."""
    run = tmp_path / "run"
    posbench("train", *SMOKE, "encoding=rope", "train.pose_target=512", "train.steps=6", f"hydra.run.dir={run}")
    rows = pd.read_csv(run / "results.csv")
    assert rows.eval_len.tolist() == [32, 64, 128, 256, 512] and (rows.status == "ok").all() and rows.ppl.notna().all()
    posbench("eval", f"checkpoint={run}", "eval.lengths=[32,64]", "eval.recompute=true", "device=cpu")
    proc = posbench("eval", f"checkpoint={run}", "probe=passkey", "probe.lengths=[64]", "probe.depths=[0]",
                    "probe.trials=1", "device=cpu")
    assert (run / "passkey.csv").is_file(), proc.stderr[-500:]


@pytest.mark.parametrize("args, message", [
    (["encoding=rope", "train.pose_target=32"], "train.pose_target=32 is not valid; valid: null (positions 0..T-1) "
                                                "or an integer > train.train_len=32"),
    (["encoding=nope", "train.pose_target=512"], "train.pose_target=512 has no effect on encoding=nope"),
    (["encoding=learned", "train.pose_target=512"], "valid: encoding.max_len >= 512"),
])
def test_settings_that_cannot_work_are_one_line_errors_that_leave_nothing(tmp_path, args, message):
    bad = tmp_path / "bad"
    proc = posbench("train", *SMOKE, *args, f"hydra.run.dir={bad}", check=False)
    assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr[-500:]
    assert not bad.exists()
