"""Probe scores in the report (posbench.report.probes): the pooled score by length with its
interval, checked against Wilson's formula written out, and each line's effective length by
RULER's rule with its interval."""

import math

import pandas as pd
import pytest

from posbench.report.probes import effective_length_lines, effective_lengths, probe_markdown, probe_summary

Z = 1.959963984540054  # the normal 97.5% quantile


def wilson(k, n):
    """Wilson's score interval, written from its formula."""
    p = k / n
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z / (1 + Z * Z / n) * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n))
    return centre - half, centre + half


def rows(correct, seed=0, encoding="rope", lengths=(64, 128, 256, 512), trials=5):
    """Two depths per length, ``correct`` a list of (depth 0, depth 1) counts per length."""
    return pd.DataFrame([{"encoding": encoding, "rope_scaling": "none", "train_len": 64, "seed": seed, "length": n,
                          "depth": d, "trials": trials, "correct": c[i], "accuracy": c[i] / trials, "status": "ok"}
                         for n, c in zip(lengths, correct) for i, d in enumerate((0.0, 1.0))])


def test_the_score_pools_depths_and_its_interval_is_wilsons():
    s = probe_summary(rows([(5, 5), (5, 4), (2, 2), (3, 3)]))
    assert list(s.length) == [64, 128, 256, 512] and list(s.trials) == [10] * 4
    assert list(s.score) == pytest.approx([1.0, 0.9, 0.4, 0.6])
    for r in s.itertuples():
        assert (r.ci_low, r.ci_high) == pytest.approx(wilson(r.correct, r.trials), abs=1e-9)
        assert r.ci_low <= r.score <= r.ci_high


def test_seeds_that_disagree_widen_the_interval_to_their_t_interval():
    """Seeds at 0.2 and 0.8 (10 prompts each): the t interval of two seeds, 0.5 +- 12.706 x 0.3,
    covers [0, 1], far wider than Wilson's over the 20 prompts pooled."""
    s = probe_summary(pd.concat([rows([(1, 1)], 0, lengths=(64,)), rows([(4, 4)], 1, lengths=(64,))]))
    assert s.seeds.iloc[0] == 2 and s.score.iloc[0] == pytest.approx(0.5)
    assert (s.ci_low.iloc[0], s.ci_high.iloc[0]) == (0.0, 1.0)
    same = probe_summary(pd.concat([rows([(2, 2)], 0, lengths=(64,)), rows([(2, 2)], 1, lengths=(64,))]))
    assert (same.ci_low.iloc[0], same.ci_high.iloc[0]) == pytest.approx(wilson(8, 20))  # seeds agree: Wilson's


def test_effective_length_is_rulers_rule_with_its_interval():
    s = probe_summary(pd.concat([rows([(5, 5), (5, 4), (2, 2), (3, 3)]),
                                 rows([(1, 1), (5, 5), (5, 5), (5, 5)], encoding="alibi")]))
    found = effective_lengths(s, 0.5).set_index("label")
    # rope: 1.0, 0.9 hold; 0.4 at 256 ends it (the later 0.6 does not count); Wilson of 4/10 reaches 0.5
    assert found.loc["rope", ["effective", "low", "high"]].tolist() == [128, 128, 512]
    # alibi: 0.2 at the shortest length: none; but its interval [0.06, 0.51] reaches 0.5, and so
    # do those of the perfect lengths after it, so the interval's high end is the longest
    assert pd.isna(found.loc["alibi", "effective"]) and pd.isna(found.loc["alibi", "low"])
    assert found.loc["alibi", "high"] == 512
    assert effective_length_lines(s, "passkey", 0.5) == [
        "passkey, alibi: effective length < 64, 95% interval < 64 .. 512 (score >= 0.5 at every length probed up to it)",
        "passkey, rope: effective length 128 (2x train_len), 95% interval 128 .. 512 (score >= 0.5 at every "
        "length probed up to it)"]


def test_lengths_that_could_not_run_are_left_out_and_the_table_counts_prompts():
    r = rows([(5, 5), (5, 5)], lengths=(64, 128))
    r.loc[r.length == 128, "status"] = "n/a: past the table"
    s = probe_summary(r)
    assert list(s.length) == [64]
    lo, hi = wilson(10, 10)
    assert probe_markdown(s).splitlines()[-1] == f"| rope | 1.00 [{lo:.2f}, {hi:.2f}] (10/10) |"


def test_report_writes_the_probe_section_and_probes_csv(smoke_run_copy, tmp_path):
    from tests.conftest import posbench

    posbench("eval", f"checkpoint={smoke_run_copy}", "probe=passkey", "probe.lengths=[64,128]", "probe.depths=[0,1]",
             "probe.trials=2", "device=cpu")
    out = tmp_path / "report"
    done = posbench("report", smoke_run_copy, "--out", out, "--threshold", "0.25")
    md = (out / "report.md").read_text()
    assert "## Probes" in md and "### passkey" in md and "| alibi | " in md
    assert "passkey, alibi: effective length" in done.stdout and "score >= 0.25" in md
    table = pd.read_csv(out / "probes.csv")
    assert list(table.length) == [64, 128] and set(table.probe) == {"passkey"} and (table.trials == 4).all()
    bad = posbench("report", smoke_run_copy, "--out", tmp_path / "bad", "--threshold", "2", check=False)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1] == (
        "posbench: error: report: --threshold 2 is not valid; valid: a score in [0, 1], e.g. 0.5")
    assert not (tmp_path / "bad").exists()
