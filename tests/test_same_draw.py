"""scripts/same_draw.py: two trainings of the same runs paired by path, their NLL compared row by row."""

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def write_run(root: Path, rel: str, nll: list[float], digest: str = "abc123", code: str = "0.1.0+x"):
    run = root / rel
    run.mkdir(parents=True)
    pd.DataFrame({"encoding": "rope", "split": "validation", "mode": "nonoverlapping", "eval_len": [128, 256, 2048],
                  "nll": nll, "ppl": [math.exp(v) for v in nll], "status": "ok", "config_hash": digest,
                  "code_version": code}).to_csv(run / "results.csv", index=False)


def same_draw(a: Path, b: Path):
    return subprocess.run([sys.executable, ROOT / "scripts/same_draw.py", a, b], capture_output=True, text=True)


def test_pairs_by_path_and_reports_the_largest_nll_difference_and_each_1x_ppl_and_16x_ratio(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_run(a, "rope/seed=1", [3.9, 4.0, 5.3])
    write_run(b, "rope/seed=1", [3.9, 4.0, 5.3], code="0.1.0+y")  # the same draw
    write_run(a, "rope/seed=0", [3.9, 4.0, 5.3])
    write_run(b, "rope/seed=0", [3.9, 4.1, 5.0])  # another draw: 0.3 apart at 2048
    write_run(a, "t5/seed=0", [4.0, 4.0, 4.0])
    write_run(b, "t5/seed=0", [4.0, 4.0, 4.0], digest="def456")
    write_run(a, "alibi/seed=0", [4.0, 4.0, 4.0])  # under a alone: not listed
    r = same_draw(a, b)
    assert r.returncode == 0, r.stderr
    lines = {line.split(" | ")[0].strip("| "): line for line in r.stdout.splitlines()[2:]}
    assert set(lines) == {"rope/seed=0", "rope/seed=1", "t5/seed=0"}
    assert lines["rope/seed=1"] == (f"| rope/seed=1 | 3 | 0 | {math.exp(3.9):.2f} | {math.exp(3.9):.2f} | "
                                    f"{math.exp(1.4):.3f} | {math.exp(1.4):.3f} | 0.1.0+x / 0.1.0+y |")
    assert f"| 3 | 0.3 | 49.40 | 49.40 | {math.exp(1.4):.3f} | {math.exp(1.1):.3f} |" in lines["rope/seed=0"]
    assert "config hashes differ: abc123 / def456" in lines["t5/seed=0"]


def test_two_trees_with_no_run_in_common_is_one_line(tmp_path):
    write_run(tmp_path / "a", "rope/seed=0", [3.9, 4.0, 5.3])
    (tmp_path / "b").mkdir()
    r = same_draw(tmp_path / "a", tmp_path / "b")
    assert r.returncode != 0 and r.stderr.strip() == (
        f"same_draw: no run is under both {tmp_path / 'a'} and {tmp_path / 'b'} (paired by their paths below each)")
