"""The report's context section (KERPLE's control): the same tokens with a train_len window and
with a longer sliding one, against the difference computed token by token here."""

import numpy as np
import pandas as pd
import pytest
from conftest import posbench

from posbench.eval.token_nll import FILE, merge_token_nll, token_key
from posbench.report.context import context_gain, offset_edges


def direct_gain(short_nll, long_nll, short, long, lo, hi):
    """The definition, one token at a time."""
    diffs = [float(short_nll[t]) - float(long_nll[t]) for t in range(len(short_nll)) if t >= long and lo <= t % short < hi]
    return sum(diffs) / len(diffs)


def fake_runs(tmp_path, seeds=(0, 1), n=400, short=8, long=32, stride=8):
    rng = np.random.default_rng(0)
    rows, arrays = [], {}
    for seed in seeds:
        run = tmp_path / f"seed={seed}"
        run.mkdir()
        a, b = rng.gamma(4.0, 1.0, n), rng.gamma(4.0, 0.9, n)
        merge_token_nll(run / FILE, {token_key("validation", "nonoverlapping", short, "none", short): a,
                                     token_key("validation", "sliding", stride, "none", long): b})
        arrays[seed] = (a.astype(np.float32), b.astype(np.float32))
        for mode, length, st in (("nonoverlapping", short, short), ("sliding", long, stride)):
            rows.append({"run": str(run), "status": "ok", "encoding": "alibi", "rope_scaling": "none", "mode": mode,
                         "stride": st, "eval_len": length, "train_len": short, "split": "validation", "seed": seed,
                         "model": "tiny", "data": "sotu", "tokens": n, "variant": ""})
    return pd.DataFrame(rows), arrays


def test_the_gain_by_offset_is_the_token_by_token_difference(tmp_path):
    df, arrays = fake_runs(tmp_path)
    gain = context_gain(df)
    assert list(gain.offsets) == ["0-1", "2-3", "4-5", "6-7", "all"]
    assert set(gain.context) == {"sliding 32/8"} and set(gain.line) == {"alibi"} and (gain.seeds == 2).all()
    for row in gain.itertuples():
        expect = np.mean([direct_gain(a, b, 8, 32, row.offset_lo, row.offset_hi + 1) for a, b in arrays.values()])
        assert row.gain == pytest.approx(expect, rel=1e-9)
        assert row.low < row.gain < row.high and row.method == "seeds+text"
    # the bins' token counts add up to all tokens past the first long window
    assert gain[gain.offsets != "all"].tokens.sum() == gain[gain.offsets == "all"].tokens.iloc[0] == 400 - 32


def test_runs_without_both_rows_or_their_token_nll_give_no_section(tmp_path):
    df, _ = fake_runs(tmp_path, seeds=(0,))
    assert context_gain(df[df["mode"] == "nonoverlapping"]).empty  # no sliding row
    (tmp_path / "seed=0" / FILE).unlink()
    assert context_gain(df).empty  # rows, but no per-token NLL (a shipped baseline's block sums)


def test_offset_bins_cover_the_window():
    assert offset_edges(128).tolist() == [0, 32, 64, 96, 128]
    assert offset_edges(3).tolist() == [0, 1, 2, 3]


@pytest.mark.slow
def test_a_sliding_evaluation_adds_the_context_section_to_the_report(smoke_run_copy, tmp_path):
    run = smoke_run_copy  # alibi, train_len 32
    posbench("eval", f"checkpoint={run}", "eval.mode=sliding", "eval.stride=16", "eval.lengths=[64]")
    out = tmp_path / "report"
    posbench("report", str(run), "--out", str(out))
    gain = pd.read_csv(out / "context.csv")
    assert list(gain.offsets) == ["0-7", "8-15", "16-23", "24-31", "all"] and set(gain.context) == {"sliding 64/16"}
    assert (gain.method == "text (1 seed)").all() and (gain.low < gain.gain).all() and (gain.gain < gain.high).all()
    with np.load(run / FILE) as f:
        a, b = f[token_key("validation", "nonoverlapping", 32, "none", 32)], f[token_key("validation", "sliding", 16,
                                                                                          "none", 64)]
    assert a.size == b.size == 2048  # the sliding command scored the run's own tokens (one token set per run)
    assert gain.gain.iloc[-1] == pytest.approx(direct_gain(a, b, 32, 64, 0, 32), rel=1e-6)
    text = (out / "report.md").read_text()
    assert "## Context" in text and "| alibi | sliding 64/16 |" in text and (out / "context.png").is_file()
