"""posbench.runs.threads: a job uses the cores other processes leave idle, re-checked as it runs."""

import json
import os
import subprocess
import sys

import pytest

from conftest import SMOKE, posbench
from posbench.runs import threads
from posbench.runs.threads import Sample, ThreadPolicy, choose, others_busy, read_sample

CORES = len(threads.allowed_cores())


def test_choose_takes_the_idle_cores_at_least_one_at_most_the_cap():
    assert choose(2, 0.0) == 2 and choose(2, 0.3) == 2  # a light process does not take a core
    assert choose(2, 0.7) == 1 and choose(2, 1.0) == 1 and choose(2, 5.0) == 1
    assert choose(16, 3.2) == 13 and choose(16, 3.2, cap=4) == 4 and choose(16, 0.0, cap=8) == 8


def test_others_busy_is_the_cores_busy_minus_this_process(tmp_path):
    stat = tmp_path / "stat"
    # cpu0 and cpu1 (user nice system idle iowait irq softirq ...); cpu2 is not ours
    stat.write_text("cpu  1 1 1 1 1 1 1\ncpu0 100 0 0 900 0 0 0 0\ncpu1 50 0 50 900 0 0 0 0\ncpu2 999 0 0 0 0 0 0\n")
    first = read_sample([0, 1], stat)
    hz = os.sysconf("SC_CLK_TCK")
    assert first.busy == pytest.approx(200 / hz)
    before = Sample(wall=0.0, busy=0.0, own=0.0)
    after = Sample(wall=2.0, busy=3.0, own=1.2)  # 3 core-seconds busy in 2 s, 1.2 of them ours
    assert others_busy(before, after) == pytest.approx(0.9)
    assert others_busy(before, Sample(2.0, 1.0, 1.5)) == 0.0  # never negative (rounding of ticks)


def test_a_set_omp_num_threads_fixes_the_count(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert ThreadPolicy().fixed


PROBE = ("import os; os.environ.pop('OMP_NUM_THREADS', None); "
         "from posbench.runs.threads import ThreadPolicy; print(ThreadPolicy(first_look=0.5).start())")


@pytest.mark.skipif(CORES < 2, reason="needs two cores")
def test_beside_a_busy_process_a_job_leaves_it_a_core():
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        chosen = int(subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                                    check=True).stdout)
    finally:
        busy.kill()
        busy.wait()
    assert 1 <= chosen <= CORES - 1


@pytest.mark.slow
@pytest.mark.skipif(CORES < 2, reason="needs two cores")
def test_a_training_run_beside_a_busy_process_records_its_threads(tmp_path):
    run = tmp_path / "run"
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        posbench("train", *SMOKE, "encoding=alibi", "train.steps=10", "train.log_every=5", "eval.multiples=[1]",
                 f"hydra.run.dir={run}", env={"OMP_NUM_THREADS": None})
    finally:
        busy.kill()
        busy.wait()
    logged = [json.loads(line)["threads"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert logged and all(1 <= n <= CORES - 1 for n in logged)
