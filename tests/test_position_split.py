"""scripts/position_split.py: each part of the window's token-weighted NLL per train length, and
its refusals (two token sets, a cut inside a bin, one train length, two configs of one line)."""

import math

import pandas as pd
import pytest
from conftest import load_script

split = load_script("position_split")
BINS = [(0, 0, 10), (1, 1, 10), (2, 3, 20)]  # (bin_start, bin_end, tokens) at L = 4


def run(root, encoding, train_len, seed, nlls, config="c", tokens=None, eval_len=4):
    d = root / f"len{train_len}" / encoding / f"seed={seed}"
    d.mkdir(parents=True)
    rows = [{"encoding": encoding, "rope_scaling": "none", "train_len": train_len, "eval_len": eval_len,
             "seed": seed, "split": "validation", "mode": "nonoverlapping", "stride": eval_len, "bin_start": s,
             "bin_end": e, "nll": v, "tokens": (tokens or {}).get(s, n), "config_hash": f"{config}{train_len}",
             "code_version": "0.1.0", "scaling": "none", "method": "none"}
            for (s, e, n), v in zip(BINS, nlls)]
    pd.DataFrame(rows).to_csv(d / "positions.csv", index=False)


def test_parts_are_token_weighted_and_seeds_averaged(tmp_path):
    run(tmp_path, "a", 2, 0, [3.0, 2.0, 1.0])
    run(tmp_path, "a", 2, 1, [5.0, 2.0, 1.5])
    run(tmp_path, "a", 4, 0, [4.0, 4.0, 0.5])
    lines = split.table([str(tmp_path)], 4).splitlines()
    assert lines[2] == ("| encoding | seeds (2 / 4) | NLL at 0-1, train_len 2 | NLL at 0-1, train_len 4 | 4 - 2 | "
                        "NLL at 2-3, train_len 2 | NLL at 2-3, train_len 4 | 4 - 2 | ppl(4), train_len 2 | "
                        "ppl(4), train_len 4 |")
    # train_len 2: positions 0-1 are (3+2)/2 = 2.5 and (5+2)/2 = 3.5, mean 3.0; positions 2-3: 1.25;
    # the whole window (10 x 3 + 10 x 2 + 20 x 1) / 40 = 1.75 and 2.5: ppl exp(2.125)
    # train_len 4: 4.0 and 0.5; the whole window (40 + 40 + 10) / 40 = 2.25
    assert lines[4] == (f"| a | 2 / 1 | 3.000 [2.500, 3.500] | 4.000 | +1.000 | 1.250 [1.000, 1.500] | 0.500 | "
                        f"-0.750 | {math.exp(2.125):.2f} | {math.exp(2.25):.2f} |")


def test_a_line_of_one_column_has_dashes_for_the_other(tmp_path):
    run(tmp_path, "a", 2, 0, [3.0, 2.0, 1.0])
    run(tmp_path, "a", 4, 0, [4.0, 4.0, 0.5])
    run(tmp_path, "b", 2, 0, [1.0, 1.0, 1.0])
    assert split.table([str(tmp_path)], 4).splitlines()[5] == \
        "| b | 1 / 0 | 1.000 | - | - | 1.000 | - | - | 2.72 | - |"


def test_runs_scoring_other_tokens_are_refused(tmp_path):
    run(tmp_path, "a", 2, 0, [3.0, 2.0, 1.0])
    run(tmp_path, "a", 4, 0, [4.0, 4.0, 0.5], tokens={2: 24})
    with pytest.raises(SystemExit, match="scores other tokens at 4 than the other runs"):
        split.table([str(tmp_path)], 4)


def test_a_cut_inside_a_bin_names_the_bins(tmp_path):
    run(tmp_path, "a", 3, 0, [3.0, 2.0, 1.0])
    run(tmp_path, "a", 4, 0, [4.0, 4.0, 0.5])
    with pytest.raises(SystemExit, match=r"cut at position 3 falls inside a bin.*valid: .*\(0, 1, 2\)"):
        split.table([str(tmp_path)], 4)


def test_one_train_length_and_a_missing_length_are_refused(tmp_path):
    run(tmp_path, "a", 2, 0, [3.0, 2.0, 1.0])
    with pytest.raises(SystemExit, match=r"one train length \(2\)"):
        split.table([str(tmp_path)], 4)
    with pytest.raises(SystemExit, match=r"--length 8; valid: 4"):
        split.table([str(tmp_path)], 8)


def test_two_configs_of_one_line_are_refused(tmp_path):
    run(tmp_path, "a", 2, 0, [3.0, 2.0, 1.0])
    run(tmp_path, "a", 2, 1, [3.0, 2.0, 1.0], config="d")
    run(tmp_path, "a", 4, 0, [4.0, 4.0, 0.5])
    # the report's own check (collect.check_one_config), with the script's name and advice
    with pytest.raises(SystemExit, match=r"position_split: cannot average a runs whose configs differ in "
                       r"config_hash \(c2 in .*, d2 in .*pass the dirs of one config per line and train length"):
        split.table([str(tmp_path)], 4)


def test_each_part_names_the_lines_whose_seeds_fell_apart(tmp_path):
    run(tmp_path, "a", 2, 0, [3.0, 2.0, 1.0])
    run(tmp_path, "a", 2, 1, [5.0, 2.0, 1.5])
    run(tmp_path, "a", 4, 0, [4.0, 4.0, 0.5])   # 0-1: 4.0 above 2.5 and 3.5; 2-3: 0.5 below 1.0 and 1.5
    run(tmp_path, "b", 2, 0, [1.0, 1.0, 1.0])
    run(tmp_path, "b", 4, 0, [1.0, 1.0, 1.0])   # the same in both parts: ranges overlap
    run(tmp_path, "c", 2, 0, [1.0, 1.0, 1.0])   # one column only: left out
    lines = split.table([str(tmp_path)], 4).splitlines()
    assert lines[-2] == "- positions 0-1: above: a (1 / 2 seeds); below: none; ranges overlap: b (1 / 1 seeds)"
    assert lines[-1] == "- positions 2-3: above: none; below: a (1 / 2 seeds); ranges overlap: b (1 / 1 seeds)"


def test_a_seed_found_twice_is_refused_not_averaged(tmp_path):
    run(tmp_path / "x", "a", 2, 0, [3.0, 2.0, 1.0])
    run(tmp_path / "y", "a", 2, 0, [3.0, 2.0, 1.0])
    run(tmp_path / "x", "a", 4, 0, [4.0, 4.0, 0.5])
    # the report's own check (collect.check_one_run_per_seed), with the script's name and advice
    with pytest.raises(SystemExit, match=r"position_split: seed 0 of a \(train_len 2, L=4\) is in two runs, "
                       r".*x.* and .*y.*: pooled.*pass dirs holding each seed once"):
        split.table([str(tmp_path / "x"), str(tmp_path / "y")], 4)
