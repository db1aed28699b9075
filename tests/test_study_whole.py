"""A study that exits 0 has every planned run exported and reported: a run left unexported by a study
that died is exported by the same command, a job refused because another process holds its run
dir fails the study, and two studies of one file do not run at once."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_study import ROOT, posbench, write_study

from posbench.runs.lock import hold

pytestmark = pytest.mark.slow

TWO = """description: two smoke runs
out: {tmp}/out
runs: {tmp}/runs
results: {tmp}/results
common: [experiment=smoke, train.steps=4, "eval.multiples=[1,2]"]
stages:
  - name: a
    grid: {{encoding: [alibi], seed: [0, 1]}}
"""


def one_line_error(r) -> str:
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def seeds_reported(tmp_path) -> list[int]:
    """The seed counts of the report's cells (report.csv's n_ok)."""
    import pandas as pd

    return sorted(pd.read_csv(tmp_path / "results" / "report.csv").n_ok.unique())


def test_a_finished_run_without_its_export_is_exported_by_the_same_command(tmp_path):
    cfg = write_study(tmp_path, TWO.format(tmp=tmp_path))
    r = posbench("study", "--config-dir", str(cfg), "mini", "--jobs", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    export = tmp_path / "runs" / "a" / "encoding=alibi" / "seed=1"
    shutil.rmtree(export)  # as a study that died between its sweep's end and the export
    report = (tmp_path / "results" / "report.md").read_bytes()
    line = one_line_error(posbench("study", "--config-dir", str(cfg), "mini", "--step", "report"))
    assert line == (f"posbench: error: study mini: 1 finished run(s) under {tmp_path / 'out'} are not exported, so "
                    f"the report would lack them: {tmp_path / 'out' / 'a' / 'encoding=alibi' / 'seed=1'}; valid: "
                    "posbench study mini --step export (or the plain command), then report")
    assert (tmp_path / "results" / "report.md").read_bytes() == report and not export.exists()
    r = posbench("study", "--config-dir", str(cfg), "mini")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 of 2 runs done; 0 to train; 1 finished run(s) to export" in r.stdout
    assert "exported 1 finished run(s) that were not" in r.stdout
    assert (export / "blocks.npz").is_file() and seeds_reported(tmp_path) == [2]


TWO_STAGES = TWO + """  - name: b
    grid: {{encoding: [rope], seed: [0]}}
"""


def test_a_report_that_would_lack_planned_runs_is_refused_or_marked_partial(tmp_path):
    """Stage b not trained: the report step refuses in one line naming its run, writing nothing;
    --partial draws the report of stage a, report.md and report.html opened by the line that names
    what it lacks; once b is trained the plain report has no such line."""
    cfg = write_study(tmp_path, TWO_STAGES.format(tmp=tmp_path))
    r = posbench("study", "--config-dir", str(cfg), "mini", "--only", "a", "--step", "train", "--jobs", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    line = one_line_error(posbench("study", "--config-dir", str(cfg), "mini", "--step", "report"))
    assert line == ("posbench: error: study mini: 1 of its 3 planned runs are not exported, so its report would be "
                    "partial: b/encoding=rope/seed=0; valid: posbench study mini to train them, or --step report "
                    "--partial for a report of the 2 that are, marked partial")
    assert not (tmp_path / "results").exists()
    r = posbench("study", "--config-dir", str(cfg), "mini", "--step", "report", "--partial")
    assert r.returncode == 0, r.stdout + r.stderr
    md = (tmp_path / "results" / "report.md").read_text()
    assert md.startswith("> **Partial report: 2 of the 3 runs study mini plans are exported and drawn here; not yet: "
                         "b/encoding=rope/seed=0.")
    assert "rope" not in md.split("\n\n", 1)[1]  # the lines drawn: alibi's alone
    assert '<p class="warning"><strong>Partial report: 2 of the 3' in (tmp_path / "results" / "report.html").read_text()
    r = posbench("study", "--config-dir", str(cfg), "mini", "--jobs", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    md = (tmp_path / "results" / "report.md").read_text()
    assert "Partial report" not in md and "rope" in md


def test_a_report_of_a_study_with_nothing_exported_is_refused_in_one_line(tmp_path):
    """Nothing trained: the report step names the planned count and the command, writing nothing."""
    cfg = write_study(tmp_path, TWO_STAGES.format(tmp=tmp_path))
    for partial in ([], ["--partial"]):
        line = one_line_error(posbench("study", "--config-dir", str(cfg), "mini", "--step", "report", *partial))
        assert line == (f"posbench: error: study mini: none of its 3 planned runs is exported under "
                        f"{tmp_path / 'runs'}, so there is nothing to report yet; valid: posbench study mini to "
                        "train and export them")
    assert not (tmp_path / "results").exists() and not (tmp_path / "runs").exists()


def test_a_job_refused_because_another_process_holds_its_run_dir_fails_the_study(tmp_path):
    """As a study SIGKILLed while its sweep lives on, run again: the orphaned job holds seed 0's run
    dir, so the new sweep's job for it is refused, and the study exits non-zero, not with a
    report of seed 1 alone; once the holder is gone, the same command completes it."""
    cfg = write_study(tmp_path, TWO.format(tmp=tmp_path))
    with hold(tmp_path / "out" / "a" / "encoding=alibi" / "seed=0", "train"):
        r = posbench("study", "--config-dir", str(cfg), "mini", "--jobs", "2")
    line = one_line_error(r)
    log = tmp_path / "out" / "a" / "encoding=alibi.log"
    assert line == f"posbench: error: study mini: 1 sweep(s) failed; their logs: {log}"
    assert "is in use by posbench train" in log.read_text()
    assert not (tmp_path / "results").exists()
    r = posbench("study", "--config-dir", str(cfg), "mini", "--jobs", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 of 2 runs done; 1 to train" in r.stdout and seeds_reported(tmp_path) == [2]


def test_a_second_study_of_one_file_is_refused_in_one_line(tmp_path):
    cfg = write_study(tmp_path, TWO.format(tmp=tmp_path))
    with hold(tmp_path / "out", "study"):  # this process is the first study
        r = posbench("study", "--config-dir", str(cfg), "mini")
        line = one_line_error(r)
        assert line.startswith(f"posbench: error: study folder '{tmp_path / 'out'}' is in use by posbench study (pid ")
        assert line.endswith("; wait for it to finish")
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".posbench.lock"]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()
    r = posbench("study", "--config-dir", str(cfg), "mini", "--step", "plan")  # a plan reads only: never refused
    assert r.returncode == 0 and "0 of 2 runs done; 2 to train" in r.stdout


def test_an_export_that_cannot_be_written_is_one_line_and_the_same_command_exports_it(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")  # the runs folder lies under a file: every export fails
    cfg = write_study(tmp_path, TWO.format(tmp=tmp_path).replace(f"runs: {tmp_path}/runs", f"runs: {blocker}/runs")
                      .replace("seed: [0, 1]", "seed: [0]"))
    line = one_line_error(posbench("study", "--config-dir", str(cfg), "mini"))
    assert line.startswith(f"posbench: error: cannot write '{blocker}/runs") and "Not a directory" in line
    blocker.unlink()
    r = posbench("study", "--config-dir", str(cfg), "mini")
    assert r.returncode == 0 and "1 of 1 runs done; 0 to train; 1 finished run(s) to export" in r.stdout, r.stderr
    assert seeds_reported(tmp_path) == [1]


def test_a_plan_says_what_each_sweep_costs_and_times_it_once_this_machine_has_trained_one(tmp_path):
    """Tokens and the preflight's peak memory from the config alone; the time from the throughput
    a run of the same model and train_len measured on this machine (none yet: unknown)."""
    import re

    one = TWO.format(tmp=tmp_path).replace('"eval.multiples=[1,2]"]', '"eval.multiples=[1,2]", train.train_len=24]')
    cfg = write_study(tmp_path, one.replace("seed: [0, 1]", "seed: [0]"))
    r = posbench("study", "--config-dir", str(cfg), "mini", "--step", "plan")
    assert r.returncode == 0, r.stderr
    # experiment=smoke: 4 steps x batch 8 x 24 tokens
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("  a encoding=alibi: ")]
    assert "1 run(s) x 768 training tokens = 768; time unknown on this machine" in line
    assert re.search(r"; peak memory about \d+\.\d\d GB a run$", line)
    assert posbench("study", "--config-dir", str(cfg), "mini").returncode == 0
    write_study(tmp_path, one)  # a second seed to train
    r = posbench("study", "--config-dir", str(cfg), "mini", "--step", "plan")
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("  a encoding=alibi: ")]
    assert re.search(r"1 run\(s\) x 768 training tokens = 768; about \d+ s \(\d+ s a run, at the median tokens/s of "
                     r"1 alibi run\(s\) on this machine\)", line), line


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (its children, theirs, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def test_a_study_whose_whole_tree_is_sigkilled_completes_on_the_same_command(tmp_path):
    """SIGKILL to the study and every process below it (an OOM kill of the job, a node lost) in
    the middle of training: no checkpoint-and-stop, no export; the same command resumes the runs
    from their last checkpoints and reports every run once."""
    body = TWO.format(tmp=tmp_path).replace("train.steps=4", "train.steps=60")
    cfg = write_study(tmp_path, body)
    cmd = [sys.executable, "-m", "posbench.cli", "study", "--config-dir", str(cfg), "mini", "--jobs", "2"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = tmp_path / "out" / "a" / "encoding=alibi" / "seed=0" / "checkpoints" / "last.pt"
    deadline = time.time() + 300
    while not checkpoint.is_file():  # step 10 of 60 saved
        assert proc.poll() is None and time.time() < deadline, "the study ended before its first checkpoint"
        time.sleep(0.05)
    tree = [proc.pid, *descendants(proc.pid)]
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resuming" in (tmp_path / "out" / "a" / "encoding=alibi.log").read_text()
    assert seeds_reported(tmp_path) == [2]
    assert sorted(p.name for p in (tmp_path / "runs" / "a" / "encoding=alibi").iterdir()) == ["seed=0", "seed=1"]
