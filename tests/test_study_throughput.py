"""scripts/study_throughput.py: a study's runs side by side per execution mode, their summed
tokens/s and their losses against eager; here on the CPU, eager, and CUDA graphs refused."""

import json

import pandas as pd
from conftest import NARROW, load_script


def test_each_mode_trains_its_runs_side_by_side_and_a_failed_mode_names_its_error(tmp_path):
    out = tmp_path / "st"
    args = ["--device", "cpu", "--modes", "false", "graphs", "--encodings", "alibi", "--seeds", "0", "1",
            "--experiment", "smoke", "--skip", "1", "--extra", *NARROW, "--out", str(out)]
    script = load_script("study_throughput")
    assert script.main(args) == 0
    table = pd.read_csv(out / "throughput.csv").set_index("mode")
    eager, graphs = table.loc["eager"], table.loc["CUDA graphs"]
    assert eager.runs == 2 and eager.execution.startswith("cpu ") and eager.execution.endswith(" eager")
    assert eager.train_tokens_per_s > 0 and eager.wall_s > 0 and pd.isna(eager.mfu)  # no datasheet peak for a CPU
    assert graphs.runs == 0 and graphs.failed.count("train.compile=graphs replays steps as CUDA graphs") == 2
    for seed in (0, 1):  # each run its own dir, trained under its mode
        run = out / "runs" / "false" / "alibi" / f"seed={seed}"
        assert json.loads((run / "versions.json").read_text())["execution"] == eager.execution
    assert "| eager | 2 |" in (out / "study_throughput.md").read_text()
    walls = (out / "walls.json").read_text()
    assert script.main(args[:4] + args[5:]) == 0  # every eager run finished: none trains again
    assert (out / "walls.json").read_text() == walls
