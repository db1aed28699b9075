"""Data-parallel training and sweep launchers, run for real on CPU processes.

* torchrun with 2 gloo processes gives the losses of one process with the same global batch;
* gradient accumulation (train.micro_batch_size) gives them too;
* a sweep through submitit's local executor and one through the joblib launcher
  (hydra/launcher=local_parallel) both leave every job's rows for `posbench report`.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import COMMAND, SMOKE, posbench
from posbench.runs.distributed import World, micro_batches, shard
from posbench.errors import PosbenchError

# Ten fp32 steps of the smoke preset, a loss logged at every step.
QUICK = SMOKE + ["train.steps=10", "train.log_every=1", "train.ckpt_every=10", "train.precision=fp32",
                 "eval.multiples=[1]", "eval.max_tokens=256"]


def losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def test_micro_batches_keep_the_global_batch():
    assert micro_batches(32, None, World()) == (32, 1)
    assert micro_batches(32, 8, World()) == (8, 4)
    assert micro_batches(32, None, World(0, 4)) == (8, 1)
    assert micro_batches(32, 2, World(1, 4)) == (2, 4)  # 4 ranks x 4 micro-batches x 2 windows
    with pytest.raises(PosbenchError, match=r"train.batch_size=30 is not divisible by the 4 processes"):
        micro_batches(30, None, World(0, 4))
    with pytest.raises(PosbenchError, match=r"train.micro_batch_size=3 .* valid: \[1, 2, 4, 8\]"):
        micro_batches(8, 3, World())


def test_shards_are_disjoint_and_cover_the_global_batch():
    batch = torch.arange(12).view(6, 2)
    parts = [shard(batch, World(rank, 3)) for rank in range(3)]
    assert torch.equal(torch.cat(parts), batch)
    assert [p[:, 0].tolist() for p in parts] == [[0, 2], [4, 6], [8, 10]]


@pytest.mark.slow
def test_two_gloo_processes_match_one_process_with_the_same_global_batch(tmp_path):
    one, accum, ddp = tmp_path / "one", tmp_path / "accum", tmp_path / "ddp"
    posbench("train", *QUICK, f"hydra.run.dir={one}")
    posbench("train", *QUICK, "train.micro_batch_size=2", f"hydra.run.dir={accum}")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "posbench.cli", "train", *QUICK, f"hydra.run.dir={ddp}"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 processes x 1 micro-batches of 4" in proc.stderr

    reference = losses(one)
    assert len(reference) == 10 and reference[-1] < reference[0]
    for other in (accum, ddp):
        assert losses(other) == pytest.approx(reference, rel=1e-4)
    # Rank 0 alone wrote the files: one metrics record per step, one Hydra dir, one results table.
    assert len(losses(ddp)) == 10
    assert sorted(p.name for p in ddp.iterdir()) == sorted(p.name for p in one.iterdir())
    weights = [torch.load(d / "checkpoints" / "last.pt", weights_only=True)["model"] for d in (one, ddp)]
    for name, w in weights[0].items():
        torch.testing.assert_close(weights[1][name], w, rtol=1e-4, atol=1e-5)
    ppl = [pd.read_csv(d / "results.csv").ppl.iloc[0] for d in (one, ddp)]
    assert ppl[1] == pytest.approx(ppl[0], rel=1e-3)


def test_a_micro_batch_that_does_not_divide_the_batch_is_one_line(tmp_path):
    run = tmp_path / "run"
    proc = posbench("train", *QUICK, "train.micro_batch_size=3", f"hydra.run.dir={run}", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "posbench: error: train.micro_batch_size=3 must divide the 8 windows each of the 1 process(es) gets "
        "from train.batch_size=8; valid: [1, 2, 4, 8] or null"]
    assert not run.exists()


@pytest.mark.slow
def test_a_failed_job_under_the_parallel_launcher_fails_the_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    proc = posbench("-m", "train", *QUICK, "train.train_len=32,1000000", "hydra/launcher=local_parallel",
                    f"hydra.sweep.dir={sweep}", check=False)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "1 job(s) failed" in proc.stderr
    failed = list(sweep.rglob("FAILED"))
    assert len(failed) == 1 and "train.train_len=1000000" in str(failed[0].parent)
    assert len(list(sweep.rglob("results.csv"))) == 1


@pytest.mark.slow
def test_a_job_refused_for_a_busy_run_dir_under_the_parallel_launcher_fails_the_sweep(tmp_path):
    """The refused job writes no FAILED into the run dir another process holds: a record in the
    sweep's root, which the sweep's end reads (the job ran in a worker process)."""
    from posbench.runs.lock import hold

    sweep = tmp_path / "sweep"
    with hold(sweep / "seed=0", "train"):  # this process holds seed=0's run dir, as an orphaned job would
        proc = posbench("-m", "train", *QUICK, "seed=0,1", "hydra/launcher=local_parallel", f"hydra.sweep.dir={sweep}",
                        "hydra.sweep.subdir='seed=${seed}'", check=False)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "1 job(s) failed" in proc.stderr and f"run dir '{sweep / 'seed=0'}' is in use by posbench train" in proc.stderr
    assert not (sweep / "seed=0" / "FAILED").exists() and not (sweep / "seed=0" / "results.csv").exists()
    assert (sweep / "seed=1" / "results.csv").is_file()
    assert [f.name for f in sweep.glob("REFUSED.*")] == ["REFUSED.0"]


def group_alive(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` that still run (zombies, which an init that does
    not reap leaves behind, do not count)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


@pytest.mark.slow
def test_sigterm_to_a_parallel_sweep_checkpoints_its_job_and_starts_no_queued_one(tmp_path):
    """SIGTERM to a local_parallel sweep's process group (`kill -- -PGID`, a cluster ending the
    allocation): the running job checkpoints, and its worker ends with the launcher instead of
    idling on (or taking the queued job) as an orphan."""
    import signal
    import time

    sweep = tmp_path / "sweep"
    cmd = [*COMMAND, "-m", "train", *QUICK, "train.steps=4000", "train.ckpt_every=4000", "encoding=alibi,rope,nope",
           "hydra/launcher=local_parallel", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    deadline = time.time() + 300
    started = []
    while time.time() < deadline and proc.poll() is None and len(started) < 2:
        started = [m for m in sweep.rglob("metrics.jsonl") if len(m.read_text().splitlines()) >= 3]
        time.sleep(0.2)
    assert proc.poll() is None and sorted(m.parent.parent.name for m in started) == ["alibi", "rope"]
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=120)
    deadline = time.time() + 60  # the workers (and loky's resource tracker) end with the sweep
    while time.time() < deadline and group_alive(proc.pid):
        time.sleep(0.5)
    assert not group_alive(proc.pid)
    for job in (m.parent for m in started):
        stopped = torch.load(job / "checkpoints" / "last.pt", weights_only=True)["step"]
        assert 3 <= stopped < 4000
    assert not (sweep / "nope").exists()  # the queued job never started


@pytest.mark.slow
def test_sigterm_under_torchrun_checkpoints_every_rank_at_one_step_and_resumes(tmp_path):
    """torchrun forwards SIGTERM (a cluster's preemption) to both ranks; they agree on the step
    to stop at, rank 0 checkpoints, and the re-run resumes to the single-process losses."""
    import signal
    import time

    args = QUICK + ["train.steps=40", "train.ckpt_every=20"]
    one, ddp = tmp_path / "one", tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "posbench.cli", "train", *args, f"hydra.run.dir={ddp}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env=env)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        metrics = ddp / "metrics.jsonl"
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stderr = proc.communicate(timeout=300)[1]
    assert proc.returncode != 0
    stopped = torch.load(ddp / "checkpoints" / "last.pt", weights_only=True)["step"]
    assert 3 <= stopped < 40 and f"interrupted at step {stopped}" in stderr
    assert len(losses(ddp)) == stopped

    done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming {ddp} from step {stopped}" in done.stderr
    posbench("train", *args, f"hydra.run.dir={one}")
    assert losses(ddp) == pytest.approx(losses(one), rel=1e-4)


@pytest.mark.slow
def test_a_slurm_style_job_with_two_tasks_trains_data_parallel(tmp_path):
    """hydra.launcher.tasks_per_node=2 (as on Slurm) through submitit's local executor: the two
    tasks of one job form a process group from submitit's environment, and match one process."""
    sweep, one = tmp_path / "sweep", tmp_path / "one"
    posbench("-m", "train", *QUICK, "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2",
             "hydra.launcher.timeout_min=10", f"hydra.sweep.dir={sweep}")
    (metrics,) = sweep.rglob("metrics.jsonl")
    logs = "".join(p.read_text() for p in sweep.rglob("*_log.err"))
    assert "2 processes x 1 micro-batches of 4" in logs
    posbench("train", *QUICK, f"hydra.run.dir={one}")
    assert losses(metrics.parent) == pytest.approx(losses(one), rel=1e-4)
