"""scripts/bias_drift.py on runs it trains: the initial bias it rebuilds is the one training
started from (a run at a vanishing lr has not moved), a trained run has, and an exported run
(learned_bias.npz, no checkpoint) reads the same as its run dir."""

import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, SMOKE, posbench


def drift(*runs):
    proc = subprocess.run([sys.executable, ROOT / "scripts/bias_drift.py", *runs], capture_output=True, text=True)
    rows = [line.strip("|").split("|") for line in proc.stdout.splitlines()[2:]]
    return proc, {r[0].strip(): [float(v) for v in r[1:]] for r in rows}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("drift")
    for name, lr in [("still", "1e-12"), ("trained", "1e-2")]:
        posbench("train", *SMOKE, "encoding=t5", f"train.lr={lr}", f"hydra.run.dir={root / name}")
    return root


def test_the_rebuilt_start_is_the_trained_runs_start(runs):
    proc, found = drift(runs / "still", runs / "trained")
    assert proc.returncode == 0, proc.stderr
    std_start, std_end, move, corr = found[str(runs / "still")]
    assert std_start > 1.0 and move < 1e-6 and corr == pytest.approx(1.0, abs=1e-9)  # T5's N(0, 1) table x sqrt(16)
    std_start2, _, move2, corr2 = found[str(runs / "trained")]
    assert std_start2 == std_start  # the same seed draws the same table
    assert move2 > 1e-3 and corr2 < 1.0


def test_an_exported_run_reads_as_its_run_dir(runs, tmp_path):
    from posbench.report.learned_bias import TABLE_FILE, run_bias, write_bias_table

    shutil.copyfile(runs / "trained/config.yaml", tmp_path / "config.yaml")
    write_bias_table(run_bias(runs / "trained")[1], tmp_path / TABLE_FILE)
    _, found = drift(runs / "trained", tmp_path)
    assert found[str(tmp_path)] == pytest.approx(found[str(runs / "trained")], rel=1e-6)


def test_a_run_without_a_learned_bias_is_one_line(runs, tmp_path):
    (tmp_path / "config.yaml").write_text((runs / "trained/config.yaml").read_text())
    proc, _ = drift(tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert f"{tmp_path} has no learned position bias" in proc.stderr
    proc, _ = drift(tmp_path / "nothing")
    assert proc.returncode == 2 and "is not a run dir (no config.yaml)" in proc.stderr
