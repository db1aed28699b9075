"""Faults, interruptions and bad input (docs/faults.md). Each test causes its fault for real
(SIGKILL, SIGTERM, a process dying halfway through a file, a NaN loss, a bug in one sweep
job, two runs racing to build the corpus cache, damaged checkpoints, typos) and checks that
no result is lost, silently wrong or half-written."""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from conftest import SMOKE, compose, posbench

pytestmark = pytest.mark.slow

# 40 steps with a checkpoint every 5: room to kill a run between two checkpoints.
LONG = [*SMOKE, "encoding=rope", "train.steps=40", "train.ckpt_every=5"]

# `python driver.py <posbench args>` runs the CLI in-process with a fault injected.
DRIVER = r'''
import io, os, sys, time
from pathlib import Path

import posbench.runs.rundir as checkpoint
import posbench.data.corpus as data
import posbench.train.loop as train

if "TEAR" in os.environ:  # die, as by SIGKILL, halfway through writing the temp file of TEAR
    real_atomic_write, left = checkpoint.atomic_write, [int(os.environ.get("TEAR_AFTER", "0"))]

    def atomic_write(path, write):
        if Path(path).name == os.environ["TEAR"]:
            left[0] -= 1
            if left[0] < 0:
                def torn(f):
                    buffer = io.BytesIO()
                    write(buffer)
                    f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
                    f.flush()
                    os._exit(9)  # no cleanup, no rename
                return real_atomic_write(path, torn)
        return real_atomic_write(path, write)

    checkpoint.atomic_write = atomic_write

if "DISK_FULL_AT" in os.environ:  # the disk fills up just before the Nth write of a file
    import errno
    real_write, name, n = checkpoint.atomic_write, *os.environ["DISK_FULL_AT"].split(":")
    left = [int(n)]

    def fill_disk():
        disk = Path(os.environ["DISK"])
        if os.path.ismount(disk):  # a real small file system: fill it up
            with open(disk / "filler", "wb", buffering=0) as f:
                try:
                    while True:
                        f.write(bytes(1 << 20))
                except OSError as e:
                    assert e.errno == errno.ENOSPC
        else:  # no mount allowed here: the OS call that makes data durable fails as a full disk does
            def fsync(fd):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.fsync = fsync

    def atomic_write(path, write):
        if Path(path).name == name:
            left[0] -= 1
            if left[0] < 0:
                fill_disk()
        return real_write(path, write)

    checkpoint.atomic_write = atomic_write

if "HANG_AFTER" in os.environ:  # after the Nth write of a file, say so and wait to be killed
    real_write_, hang_name, hang_n = checkpoint.atomic_write, *os.environ["HANG_AFTER"].split(":")
    hang_left = [int(hang_n)]

    def atomic_write(path, write):
        real_write_(path, write)
        if Path(path).name == hang_name:
            hang_left[0] -= 1
            if hang_left[0] == 0:
                Path(os.environ["HANG_MARKER"]).touch()
                time.sleep(600)

    checkpoint.atomic_write = atomic_write

if "BUG_AT_LR" in os.environ:  # a plain bug (not a PosbenchError) in the job with this train.lr
    real_make_optimizer = train.make_optimizer

    def make_optimizer(model, tcfg, **kwargs):
        if tcfg.lr == float(os.environ["BUG_AT_LR"]):
            return 1 / 0
        return real_make_optimizer(model, tcfg, **kwargs)

    train.make_optimizer = make_optimizer

if "BARRIER" in os.environ:  # two runs each build the corpus cache, then publish it at once
    real_train_tokenizer = data.train_tokenizer

    def train_tokenizer(*args, **kwargs):
        tokenizer = real_train_tokenizer(*args, **kwargs)
        barrier = Path(os.environ["BARRIER"])
        (barrier / str(os.getpid())).touch()
        deadline = time.time() + 300
        while len(list(barrier.iterdir())) < 2 and time.time() < deadline:
            time.sleep(0.01)
        return tokenizer

    data.train_tokenizer = train_tokenizer

from posbench.cli import main

main(sys.argv[1:])
'''


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    path = tmp_path_factory.mktemp("driver") / "driver.py"
    path.write_text(DRIVER)

    def run(*args, env=None, popen=False):
        """`posbench <args>` with the faults that ``env`` selects (TEAR, BUG_AT_LR, BARRIER)."""
        cmd = [sys.executable, str(path), *map(str, args)]
        full_env = {**os.environ, **(env or {})}
        if popen:
            return subprocess.Popen(cmd, env=full_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        return subprocess.run(cmd, env=full_env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=600)
    return run


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of LONG, to compare interrupted ones with."""
    run = tmp_path_factory.mktemp("reference") / "run"
    posbench("train", *LONG, f"hydra.run.dir={run}")
    return run


def logged_steps(run) -> list[int]:
    """Steps in metrics.jsonl, complete lines only (the run may be appending)."""
    path = run / "metrics.jsonl"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line)["step"] for line in text.split("\n")[:-1] if line]


def wait_until(proc, condition, what: str) -> None:
    deadline = time.time() + 300
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}:\n{proc.communicate()[1][-2000:]}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def checkpoint_step(run) -> int:
    return torch.load(run / "checkpoints/last.pt", weights_only=True)["step"]


def assert_same_as(run, reference) -> None:
    """Bit-identical final weights, results and metrics steps."""
    a = torch.load(reference / "checkpoints/last.pt", weights_only=True)
    b = torch.load(run / "checkpoints/last.pt", weights_only=True)
    assert a["step"] == b["step"] == 40
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    cols = ["eval_len", "ppl", "nll", "tokens", "status"]
    assert pd.read_csv(run / "results.csv")[cols].equals(pd.read_csv(reference / "results.csv")[cols])
    assert logged_steps(run) == logged_steps(reference) == list(range(5, 41, 5))


def assert_one_line_error(proc, message: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in lines if line.startswith("posbench: error: ")]
    assert len(errors) == 1 and errors[0] == lines[-1], proc.stderr[-3000:]
    assert message in errors[0], errors[0]
    return errors[0]


def snapshot(run) -> dict:
    """Every file of a run dir and its bytes, less what Hydra rewrites on each launch."""
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*")
            if p.is_file() and ".hydra" not in p.parts and p.suffix != ".log"}


# ---------------------------------------------------------------- 1. kills
def test_sigkill_then_sigterm_mid_training_and_the_rerun_is_bit_identical(tmp_path, reference):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "posbench.cli", "train", *LONG, f"hydra.run.dir={run}"]
    kill_after = random.Random(14).choice([5, 10, 15, 20])  # a logged step; the kill lands at it or a bit later
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_until(proc, lambda: kill_after in logged_steps(run), f"step {kill_after}")
    proc.kill()  # SIGKILL: no handler runs, no cleanup
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    # the last complete checkpoint; none if the kill came before the step-5 one was written
    killed_at = checkpoint_step(run) if (run / "checkpoints/last.pt").exists() else 0
    assert killed_at % 5 == 0 and kill_after - 5 <= killed_at < 40, (kill_after, killed_at)
    assert not (run / "results.csv").exists()

    # re-run; SIGTERM (`kill`, a cluster's preemption) once it trained past the checkpoint
    old_metrics = (run / "metrics.jsonl").stat().st_ino
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_until(proc, lambda: (run / "metrics.jsonl").stat().st_ino != old_metrics  # rewritten on resume
               and max(logged_steps(run), default=0) > killed_at, "progress after the resume")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "interrupted at step" in err and (f"resuming {run} from step {killed_at}" in err or not killed_at)
    termed_at = checkpoint_step(run)
    assert killed_at < termed_at < 40 and not (run / "results.csv").exists()

    proc = posbench("train", *LONG, f"hydra.run.dir={run}")
    assert f"resuming {run} from step {termed_at}" in proc.stderr
    assert_same_as(run, reference)


# ---------------------------------------------------------------- 2. killed mid-write
def test_killed_while_writing_a_checkpoint_or_results_keeps_the_previous_file(tmp_path, reference, driver):
    run, ckpt = tmp_path / "run", tmp_path / "run" / "checkpoints"
    args = ["train", *LONG, f"hydra.run.dir={run}"]
    proc = driver(*args, env={"TEAR": "last.pt", "TEAR_AFTER": "2"})  # steps 5, 10 saved; dies writing 15
    assert proc.returncode == 9, proc.stderr[-3000:]
    (torn,) = ckpt.glob(".last.pt.*")  # the half-written temp file
    assert checkpoint_step(run) == 10  # the previous checkpoint, intact and loadable
    assert 0 < torn.stat().st_size < (ckpt / "last.pt").stat().st_size
    assert not (run / "results.csv").exists()

    proc = posbench(*args)
    assert f"resuming {run} from step 10" in proc.stderr
    assert [p.name for p in ckpt.iterdir()] == ["last.pt"]  # the stray temp file is gone
    assert_same_as(run, reference)

    # dies while merging new rows into results.csv: the old table stays as it was
    before = (run / "results.csv").read_bytes()
    eval_args = ["eval", f"checkpoint={run}", "eval.lengths=[16,32]", "eval.max_tokens=2048"]
    proc = driver(*eval_args, env={"TEAR": "results.csv"})
    assert proc.returncode == 9, proc.stderr[-3000:]
    assert (run / "results.csv").read_bytes() == before and len(list(run.glob(".results.csv.*"))) == 1
    posbench(*eval_args)  # the stray temp file is ignored
    assert pd.read_csv(run / "results.csv").eval_len.tolist() == [16, 32, 64, 128, 256, 512]


# ---------------------------------------------------------------- 2b. disk full
@pytest.fixture
def small_disk(tmp_path):
    """A 128 MiB tmpfs that a test can really fill (as root where mounting is allowed); else a
    plain folder, where the driver makes fsync fail with ENOSPC instead."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = shutil.which("mount") and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=128m", "tmpfs", str(disk)], capture_output=True).returncode == 0
    yield disk
    if mounted:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def test_disk_full_while_writing_a_checkpoint_or_results_keeps_the_previous_file(small_disk, reference, driver):
    run, ckpt = small_disk / "run", small_disk / "run" / "checkpoints"
    args = ["train", *LONG, f"hydra.run.dir={run}"]
    env = {"DISK": str(small_disk), "DISK_FULL_AT": "last.pt:2"}  # steps 5 and 10 saved; full at 15
    proc = driver(*args, env=env)
    line = assert_one_line_error(proc, f"No space left on device while writing '{ckpt / 'last.pt'}'; "
                                       "the previous last.pt is unchanged; free space on that disk, then re-run")
    assert checkpoint_step(run) == 10 and [p.name for p in ckpt.iterdir()] == ["last.pt"], line
    assert not (run / "results.csv").exists()
    (small_disk / "filler").unlink(missing_ok=True)  # space is back
    proc = posbench(*args)
    assert f"resuming {run} from step 10" in proc.stderr
    assert_same_as(run, reference)

    before = (run / "results.csv").read_bytes()
    eval_args = ["eval", f"checkpoint={run}", "eval.lengths=[16,32]", "eval.max_tokens=2048"]
    proc = driver(*eval_args, env={**env, "DISK_FULL_AT": "results.csv:0"})
    assert_one_line_error(proc, f"while writing '{run / 'results.csv'}'; the previous results.csv is unchanged")
    assert (run / "results.csv").read_bytes() == before and not list(run.glob(".results.csv.*"))
    (small_disk / "filler").unlink(missing_ok=True)
    posbench(*eval_args)
    assert pd.read_csv(run / "results.csv").eval_len.tolist() == [16, 32, 64, 128, 256, 512]


# ---------------------------------------------------------------- 2c. one train per run dir
def test_a_second_train_in_a_busy_run_dir_is_refused_and_a_killed_holder_does_not_block_resume(
        tmp_path, reference, driver):
    import socket

    run, marker = tmp_path / "run", tmp_path / "paused"
    args = ["train", *LONG, f"hydra.run.dir={run}"]
    first = driver(*args, env={"HANG_AFTER": "last.pt:2", "HANG_MARKER": str(marker)}, popen=True)
    wait_until(first, marker.exists, "the first run's step-10 checkpoint")  # it now waits, holding the run dir
    before = snapshot(run)
    hydra_files = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and (".hydra" in p.parts or p.suffix == ".log")}
    holder = f"is in use by posbench train (pid {first.pid} on host {socket.gethostname()}, started "
    second = posbench(*args, check=False)
    assert_one_line_error(second, f"run dir '{run}' {holder}")
    assert second.stderr.strip().endswith("; wait for it to finish, or use another hydra.run.dir")
    assert_one_line_error(posbench("eval", f"checkpoint={run}", check=False), holder)
    assert snapshot(run) == before  # the refused processes wrote nothing
    assert {p: p.stat().st_mtime_ns for p in hydra_files} == hydra_files  # not even Hydra's own files

    first.kill()  # SIGKILL: its lock file stays behind, the kernel released the lock
    first.communicate(timeout=60)
    assert (run / ".posbench.lock").exists()
    proc = posbench(*args)
    assert f".posbench.lock was left by posbench train (pid {first.pid} on host" in proc.stderr
    assert f"resuming {run} from step 10" in proc.stderr
    assert_same_as(run, reference)
    assert not (run / ".posbench.lock").exists()  # a finished run leaves no lock file


# ---------------------------------------------------------------- 3. one sweep job fails
def test_failing_sweep_jobs_are_recorded_and_reported_and_the_others_finish(tmp_path, driver):
    sweep = tmp_path / "sweep"
    # lr 1e9 diverges (a PosbenchError); lr 2e-3 hits a bug (ZeroDivisionError); lr 1e-3 is fine
    proc = driver("-m", "train", *SMOKE, "train.steps=5", "train.ckpt_every=1", "train.lr=1e-3,1e9,2e-3",
                  f"hydra.sweep.dir={sweep}", env={"BUG_AT_LR": "2e-3"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    # job dirs name the overrides with Hydra's spelling of the values
    jobs = {lr: next(sweep.glob(f"*/*train.lr={float(lr)},*")) for lr in ("1e-3", "1e9", "2e-3")}
    ok = pd.read_csv(jobs["1e-3"] / "results.csv")
    assert len(ok) == 5 and (ok.status == "ok").all() and not (jobs["1e-3"] / "FAILED").exists()

    nan_error = (jobs["1e9"] / "FAILED").read_text().splitlines()[0]
    assert re.match(r"(loss|gradient norm) became \S+ at step \d+; the last good checkpoint", nan_error), nan_error
    assert (jobs["1e9"] / "checkpoints/last.pt").exists() and not (jobs["1e9"] / "results.csv").exists()
    bug = (jobs["2e-3"] / "FAILED").read_text()
    assert bug.startswith("ZeroDivisionError: division by zero\n") and "Traceback" in bug
    assert not (jobs["2e-3"] / "results.csv").exists()

    summary = proc.stderr[proc.stderr.index("posbench: error: 2 job(s) failed:"):]
    assert f"{jobs['1e9']}: {nan_error}" in summary
    assert f"{jobs['2e-3']}: ZeroDivisionError: division by zero" in summary

    proc = posbench("report", sweep)
    for text in (proc.stdout, (sweep / "report.md").read_text()):
        assert "2 failed run(s)" in text
        assert f"| {jobs['1e9']} | {nan_error} |" in text
        assert f"| {jobs['2e-3']} | ZeroDivisionError: division by zero |" in text
    assert len(pd.read_csv(sweep / "report.csv")) == 5  # the finished job's 5 lengths
    proc = posbench("report", jobs["2e-3"], check=False)  # nothing but a failed job
    assert_one_line_error(proc, f"1 run(s) failed: {jobs['2e-3']}: ZeroDivisionError: division by zero")


def test_a_bug_in_a_single_run_keeps_its_traceback(tmp_path, driver):
    proc = driver("train", *SMOKE, "train.lr=2e-3", f"hydra.run.dir={tmp_path / 'run'}",
                  env={"BUG_AT_LR": "2e-3"})
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and proc.stderr.strip().endswith("ZeroDivisionError: division by zero")


# ---------------------------------------------------------------- 4. NaN
def test_nan_loss_names_the_step_keeps_the_last_good_checkpoint_and_writes_no_results(tmp_path):
    run = tmp_path / "run"
    proc = posbench("train", *SMOKE, "train.lr=1e9", "train.ckpt_every=1", f"hydra.run.dir={run}", check=False)
    line = assert_one_line_error(proc, " at step ")
    m = re.search(r"(loss|gradient norm) became (\S+) at step (\d+); the last good checkpoint \(step (\d+)\) "
                  r"is kept at (\S+); no results were written; valid: a lower train.lr", line)
    assert m and m[2] in ("nan", "inf", "-inf") and int(m[4]) == int(m[3]) - 1, line
    state = torch.load(m[5], weights_only=True)
    assert state["step"] == int(m[4]) and all(torch.isfinite(t).all() for t in state["model"].values())
    assert not (run / "results.csv").exists()


# ---------------------------------------------------------------- 5. concurrent cache
def test_two_runs_building_the_corpus_cache_at_once(tmp_path, driver):
    cache, barrier = tmp_path / "cache", tmp_path / "barrier"
    barrier.mkdir()
    # one torch thread each: a count that follows the machine's load (posbench.runs.threads) can
    # change the last bits of a sum, and two runs at once load the machine unevenly
    env = {"XDG_CACHE_HOME": str(cache), "BARRIER": str(barrier), "OMP_NUM_THREADS": "1"}
    procs = [driver("train", *SMOKE, "train.steps=5", f"hydra.run.dir={tmp_path / name}", env=env, popen=True)
             for name in ("a", "b")]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    assert all("preparing corpus" in out for out, _ in outs)  # both built it, both published it
    (entry,) = [p for p in (cache / "posbench").iterdir() if p.name != "throughput.jsonl"]  # one entry, no temp dirs
    assert entry.name.startswith("sotu-")
    from posbench.data.corpus import load_corpus

    corpus = load_corpus(compose(*SMOKE).data, cache_dir=cache / "posbench", log=pytest.fail)  # reused
    assert all(corpus.splits[s].size == corpus.meta["splits"][s]["tokens"] for s in corpus.splits)
    a, b = (pd.read_csv(tmp_path / name / "results.csv") for name in ("a", "b"))
    # the same scored text at every length: same token counts covering the same bytes and words
    # (another tokenizer would cut those 2048 tokens out of other text)
    for col in ("eval_len", "tokens", "bytes", "words"):
        assert a[col].tolist() == b[col].tolist(), col
    # the same model, bit for bit (with threads that followed the load, two such runs once differed
    # by 1.3e-5 relative in ppl after 5 steps)
    assert a.ppl.tolist() == b.ppl.tolist()


# ---------------------------------------------------------------- 6. damaged checkpoints
def test_truncated_checkpoint_for_eval_and_resume(tmp_path, reference):
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    ckpt = run / "checkpoints/last.pt"
    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    before = snapshot(run)
    proc = posbench("eval", f"checkpoint={run}", check=False)
    assert_one_line_error(proc, f"checkpoint '{ckpt}' is truncated or not a torch file")
    assert snapshot(run) == before
    proc = posbench("train", *LONG, f"hydra.run.dir={run}", check=False)
    assert_one_line_error(proc, f"cannot resume: checkpoint '{ckpt}' is truncated")
    assert snapshot(run) == before


def test_foreign_checkpoint_is_refused_not_unpickled(tmp_path, reference):
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    torch.save(torch.nn.Linear(2, 2), run / "checkpoints/last.pt")  # someone else's torch file
    before = snapshot(run)
    proc = posbench("eval", f"checkpoint={run}", check=False)
    assert_one_line_error(proc, "is not a posbench checkpoint")
    assert snapshot(run) == before


def test_rerun_with_another_config_in_a_trained_run_dir(tmp_path, reference):
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    before = snapshot(run)
    proc = posbench("train", *LONG, "train.lr=2e-3", f"hydra.run.dir={run}", check=False)
    assert_one_line_error(proc, f"run dir '{run}' holds a run with another config")
    assert snapshot(run) == before


@pytest.mark.parametrize("key, value", [("d_model", 128), ("n_heads", 2)])  # n_heads keeps every shape
def test_eval_of_a_checkpoint_whose_config_has_another_model_shape(tmp_path, reference, key, value):
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    cfg = OmegaConf.load(run / "config.yaml")
    cfg.model[key] = value
    OmegaConf.save(cfg, run / "config.yaml")
    before = snapshot(run)
    proc = posbench("eval", f"checkpoint={run}", check=False)
    assert_one_line_error(proc, "does not describe the model in")
    assert snapshot(run) == before


# ---------------------------------------------------------------- 7. bad input
BAD_INPUT = {  # id: (overrides, part of the one-line error); each case is its own subprocess
    "unknown data": (["data=wiki"], "unknown data 'wiki'; valid choices: pycode, sotu, text, wikitext103, wikitext2"),
    "unknown source": (["data.source=pip"], "data.source='pip' is not valid; valid choices: sotu, text, hub, pypi"),
    "unknown sampler": (["train.sampler=twice"], "train.sampler='twice' is not valid; valid choices: random, once"),
    "zero train_len": (["train.train_len=0"], "train.train_len must be > 0, got 0"),
    "negative batch": (["train.batch_size=-1"], "train.batch_size must be > 0, got -1"),
    "zero eval length": (["eval.lengths=[0]"], "eval.lengths must be > 0, got 0"),
    "seed not int": (["seed=abc"], "seed must be an integer, got 'abc'"),
    "learned table too short": (["encoding=learned", "encoding.max_len=16"],
                                "train.train_len=32 is too long for encoding=learned"),
    "train_len past the data": (["train.train_len=10000000", "eval.lengths=[32]"],
                                "train.train_len=10000000 needs more than 10000001 train tokens"),
    "empty corpus": (["data=text", "data.files=[{blank}]"], "data=text: the corpus is empty"),
    "missing file": (["data=text", "data.files=[{missing}]"], "does not exist or is not a file"),
    "not utf-8": (["data=text", "data.files=[{latin1}]"], "is not UTF-8 text (invalid continuation byte at byte 3)"),
    "binary file": (["data=text", "data.files=[{binary}]"], "is binary, not UTF-8 text"),
    "bad grammar": (["train.steps=[1,"], "cannot parse override 'train.steps=[1,'"),
    "unknown key": (["train.stepz=100"], "unknown key 'train.stepz'; valid keys in train: batch_size, beta1"),
    "empty eval lengths": (["eval.lengths=[]"], "eval.lengths=[] is empty; valid: null (the default ladder: "
                                                "eval.multiples x train.train_len) or a list of positive lengths"),
    "empty eval multiples": (["eval.multiples=[]"], "eval.multiples=[] is empty; valid: a list of positive multiples"),
    "-m with --cfg": (["-m", "--cfg", "hydra"], "posbench train: -m/--multirun and --cfg cannot be combined"),
    "--run with -m": (["--run", "-m"], "posbench train: --run and -m/--multirun cannot be combined"),
    "--info with a bad value": (["--info", "bogus"], "argument --info/-i: invalid choice: 'bogus'"),
    "unknown flag": (["--foo"], "posbench train: unrecognized arguments: --foo; valid flags: --cfg job|hydra|all"),
    "--package without --cfg": (["--package", "train"], "--package train only works with --cfg"),
    "--resolve without --cfg": (["--resolve"], "--resolve only works with --cfg"),
}
VALID_HINTS = {"learned table too short": "valid: encoding.max_len >= 32",
               "train_len past the data": "valid: train.train_len <= "}


@pytest.fixture(scope="module")
def bad_input_runs(tmp_path_factory):
    """Every case, each in a run dir of its own."""
    root = tmp_path_factory.mktemp("bad")
    files = {"blank": b"  \n\n", "latin1": "caf\xe9 au lait".encode("latin-1"), "binary": b"\x7fELF\x00\x01"}
    for name, content in files.items():
        (root / f"{name}.txt").write_bytes(content)
    paths = {name: root / f"{name}.txt" for name in [*files, "missing"]}

    def run(case):
        cwd = root / case.replace(" ", "_")
        cwd.mkdir()
        overrides = [o.format(**paths) for o in BAD_INPUT[case][0]]
        proc = posbench("train", *SMOKE, *overrides, f"hydra.run.dir={cwd / 'run'}", cwd=cwd, check=False)
        return proc, cwd

    return {case: run(case) for case in BAD_INPUT}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(bad_input_runs, case):
    proc, cwd = bad_input_runs[case]
    line = assert_one_line_error(proc, BAD_INPUT[case][1])
    assert VALID_HINTS.get(case, "") in line
    assert list(cwd.iterdir()) == []  # no run dir, no outputs/, nothing


def test_torn_metrics_line_is_dropped_on_resume(tmp_path):
    from posbench.runs.rundir import RunDir
    from posbench.train.logger import MetricsLogger

    run = RunDir(tmp_path)
    run.metrics.write_text('{"step": 5, "loss": 1.0}\n{"step": 10, "loss": 0.9}\n{"step": 15, "lo')
    MetricsLogger(run, OmegaConf.create({"wandb": {"mode": "disabled", "project": "p"}}), resume_step=10)
    assert [json.loads(x)["step"] for x in run.metrics.read_text().splitlines()] == [5, 10]


def test_hydra_verbose_shows_the_traceback_of_a_user_error(tmp_path):
    quiet = posbench("train", *SMOKE, "model.n_heads=7", f"hydra.run.dir={tmp_path / 'a'}", check=False)
    loud = posbench("train", *SMOKE, "model.n_heads=7", "hydra.verbose=true", f"hydra.run.dir={tmp_path / 'b'}",
                    check=False)
    assert quiet.returncode == 2 and "Traceback" not in quiet.stderr
    assert loud.returncode != 0 and "Traceback" in loud.stderr and "does not divide model.d_model" in loud.stderr
