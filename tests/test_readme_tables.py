"""README tables are generated, never retyped: each table a README shows of a study's numbers is
the output of the script named beside it, regenerated here from the shipped files it reads, run
from the repository root with the paths the README's command names (a table may print them)."""

import subprocess
import sys

import pytest
from conftest import ROOT

SMOL = "results/pretrained/smollm2-135m"
TABLES = [  # (README, script, its arguments: the files it reads)
    ("README.md", "scripts/ratio_table.py", ["results/headline/report.csv"]),
    ("results/headline/README.md", "scripts/ratio_table.py", ["results/headline/report.csv"]),
    (f"{SMOL}/README.md", "scripts/method_table.py", [f"{SMOL}/report.csv"]),
    (f"{SMOL}/README.md", "scripts/longppl_table.py",
     [f"{SMOL}/longppl.csv", "--also", f"{SMOL}/longppl_short2048.csv"]),
    ("results/rerun/README.md", "scripts/same_draw.py", ["results/scale/runs/tiny", "results/rerun/cpu_scale"]),
    ("results/train_len/README.md", "scripts/position_split.py",
     ["results/scale/runs/tiny", "results/scale/runs/tiny_seeds", "results/train_len/runs", "--length", "512"]),
]


@pytest.mark.parametrize("readme, script, args", TABLES, ids=[f"{t[0]}:{t[1]}" for t in TABLES])
def test_a_readme_table_is_its_script_s_output(readme, script, args):
    table = subprocess.run([sys.executable, str(ROOT / script), *args], capture_output=True, text=True,
                           check=True, cwd=ROOT).stdout.strip()
    assert table.count("\n") >= 2
    command = f"python {script} {' '.join(args)}"
    assert table in (ROOT / readme).read_text(), f"{readme}: its table is not `{command}`'s output"


def test_the_table_script_orders_lines_and_names_the_lowest(tmp_path):
    """On a report of two lines: ascending ppl at train_len, the lowest named, the other's ratio to it."""
    import pandas as pd

    rows = []
    for label, ppl, ratio in (("b", 20.0, 1.5), ("a", 10.0, 1.0)):
        for L, p in ((4, ppl), (8, ppl * ratio)):
            rows.append({"label": label, "mode": "nonoverlapping", "train_len": 4, "eval_len": L, "ppl_mean": p,
                         "ppl_std": 0.25, "seeds": 3, "ratio_mean": p / ppl, "ratio_ci_low": p / ppl - 0.1,
                         "ratio_ci_high": p / ppl + 0.1, "vs_best": ppl / 10.0, "vs_best_ci_low": ppl / 10.0 - 0.2,
                         "vs_best_ci_high": ppl / 10.0 + 0.2})
    pd.DataFrame(rows).to_csv(tmp_path / "report.csv", index=False)
    out = subprocess.run([sys.executable, str(ROOT / "scripts/ratio_table.py"), str(tmp_path / "report.csv")],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "| encoding | seeds | L=4 | L=8 | ppl(8) / ppl(4) | ppl(4) / lowest |"
    assert out[2] == "| a | 3 | 10.0 ± 0.2 | 10.0 ± 0.2 | 1.000 [0.900, 1.100] | 1 (lowest) |"
    assert out[3] == "| b | 3 | 20.0 ± 0.2 | 30.0 ± 0.2 | 1.500 [1.400, 1.600] | 2.000 [1.800, 2.200] |"
