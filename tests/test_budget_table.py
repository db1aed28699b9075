"""scripts/budget_table.py on hand-made run dirs: runs placed by their config (budget, T5's form),
seeds averaged with intervals, the tidy CSV, the spread and ordering summary, the figure's lines."""

import subprocess
import sys

import pandas as pd
import pytest
from omegaconf import OmegaConf

from conftest import ROOT
from test_report import rows, svg_ids, write_run


def study(tmp_path):
    """alibi, t5 and t5 unscaled at 10 and 40 steps, 3 seeds; alibi flat, t5 rising 2x at 16x."""
    for line, encoding, bias in [("alibi", "alibi", None), ("t5", "t5", "sqrt_head_dim"), ("t5u", "t5", "none")]:
        for steps in (10, 40):
            for seed in (0, 1, 2):
                base = (20.0 if steps == 10 else 10.0) + seed * 0.1 + (line == "t5u")
                growth = 1.0 + 0.01 * seed if encoding == "alibi" else 2.0 + 0.01 * seed
                run = write_run(tmp_path / f"{line}/steps={steps}/seed={seed}",
                                rows(encoding, seed, {32: base, 64: base, 512: base * growth}, chash=f"{line}{steps}"),
                                steps=steps, encoding={"bias_scale": bias} if bias else None)
                cfg = OmegaConf.load(run / "config.yaml")
                cfg.train.batch_size = 4
                OmegaConf.save(cfg, run / "config.yaml")
    return tmp_path


def test_budget_table_places_runs_and_averages_seeds(tmp_path):
    study(tmp_path / "runs")
    proc = subprocess.run([sys.executable, ROOT / "scripts/budget_table.py", tmp_path / "runs", "--out", tmp_path / "out"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    frame = pd.read_csv(tmp_path / "out/budget.csv")
    assert sorted(frame.line.unique()) == ["alibi", "t5", "t5 (unscaled)"]
    mean = frame[frame.seed == "mean"].set_index(["line", "steps", "eval_len"])
    assert mean.loc[("t5 (unscaled)", 40, 32), "ppl"] == pytest.approx((11.0 * 11.1 * 11.2) ** (1 / 3))  # geometric
    assert mean.loc[("alibi", 10, 32), "train_tokens"] == 10 * 4 * 32
    assert mean.loc[("t5", 40, 512), "ratio"] == pytest.approx(2.01, rel=1e-4)  # the seeds' geometric mean
    assert (mean.ci_method == "seeds+text").all()  # three seeds, with per-token NLL
    low, high = mean.loc[("t5", 40, 512), ["ratio_ci_low", "ratio_ci_high"]]
    assert low < 2.01 < high and high - low < 0.1
    one = frame[frame.seed == "1"].set_index(["line", "steps", "eval_len"])
    assert one.loc[("alibi", 10, 512), "ppl"] == pytest.approx(20.1 * 1.01)
    assert (one.ci_method == "text (1 seed)").all()  # one seed: the text only
    table = (tmp_path / "out/budget.md").read_text().splitlines()
    assert table[2].startswith("| 1,280 | 10 | 20.10 [")  # alibi at 10 steps
    # spread: t5 unscaled's 21.1 over alibi's 20.1; its Welch interval over 3 seeds straddles 1.05
    low, high = mean.loc[("t5 (unscaled)", 10, 32), ["vs_best_ci_low", "vs_best_ci_high"]]
    assert low < 1.05 < high and high - low < 0.05
    assert mean.loc[("t5 (unscaled)", 10, 32), "vs_best"] == pytest.approx(21.1 / 20.1)
    assert table[2].endswith(f" | 1.050 [{low:.3f}, {high:.3f}] (1.050 / 1.050 / 1.050) | not distinguishable |")
    assert " | 1.099 [" in table[3] and table[3].endswith(" | no |")  # 11.1 over 10.1: alibi at 40 steps, not at 10
    assert table[5].startswith("| training tokens | steps | alibi: ppl(16x)/ppl(1x) (each seed's) |")
    assert " (1.000 / 1.010 / 1.020) | " in table[7]  # alibi's seeds at 10 steps
    assert table[7].endswith(" | alibi < t5 ~ t5 (unscaled) |")
    ids = svg_ids(tmp_path / "out/budget.svg")
    assert {"line:alibi", "line:t5", "line:t5 (unscaled)", "seeds:alibi"} <= set(ids)


def test_an_ordering_needs_the_seeds_apart_as_well_as_the_intervals():
    sys.path.insert(0, str(ROOT / "scripts"))
    from budget_table import ordering

    # two seeds each: bootstrap intervals over tokens that are narrow and apart...
    at16 = pd.DataFrame({"ratio": [4.3, 6.1, 1.5], "ratio_ci_low": [4.1, 5.4, 1.4], "ratio_ci_high": [4.5, 6.09, 1.6]},
                        index=["rope", "nope", "x"])
    seeds = pd.DataFrame({"line": ["rope", "rope", "nope", "nope", "x", "x"], "ratio": [4.37, 4.25, 3.92, 8.30, 1.45, 1.55]})
    assert ordering(at16, seeds) == "x < rope ~ nope"  # ...but nope's seeds straddle rope's
    seeds.loc[2, "ratio"] = 4.6
    assert ordering(at16, seeds) == "x < rope < nope"
