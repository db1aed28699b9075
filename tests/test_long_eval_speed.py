"""scripts/long_eval_speed.py: posbench's ladder against a plain transformers forward, run here
on the CPU at a toy shape (on a GPU it measures Llama 3.2 1B's shape to 32k the same way)."""

import pandas as pd
import pytest
from conftest import load_script

pytest.importorskip("transformers")

QUICK = ["--device", "cpu", "--shape", "tiny", "--run-model", "tiny", "--lengths", "32", "64", "--run-lengths",
         "32", "64", "--run-train-len", "16", "--tokens", "128", "--dtype", "fp32"]


def test_both_paths_score_the_same_weights_alike_and_a_rerun_measures_nothing_again(tmp_path):
    script, out = load_script("long_eval_speed"), tmp_path / "long_eval"
    assert script.main([*QUICK, "--out", str(out)]) == 0
    rows = pd.read_csv(out / "long_eval.csv")
    assert len(rows) == 8 and set(rows.path) == {"plain", "posbench"} and (rows.tokens_per_s > 0).all()
    assert (rows.windows == 128 // rows.length).all()
    nll = rows[rows.subject == "pretrained"].pivot(index="length", columns="path", values="nll")
    # the same random weights: the plain logits and posbench's sliced head give one NLL (fp32)
    assert (nll.plain - nll.posbench).abs().max() < 1e-4
    assert ((nll.plain - 6.238).abs() < 0.1).all()  # ln(512): random weights are near uniform
    text = (out / "long_eval.md").read_text()
    assert "## pretrained" in text and "## trained" in text and "| 64 | 2 |" in text
    before = (out / "long_eval.csv").read_text()
    assert script.main([*QUICK, "--out", str(out)]) == 0  # resumes: every row is there
    assert (out / "long_eval.csv").read_text() == before


def test_tokens_that_no_window_divides_are_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "long_eval"
    args = [a if a != "128" else "96" for a in QUICK]
    assert load_script("long_eval_speed").main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--tokens 96 is not a multiple of the pretrained length(s) 64; valid: a multiple of 64" in err
    assert not out.exists()
