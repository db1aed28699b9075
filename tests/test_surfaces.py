"""The newer surfaces fail in one line and write nothing: LongPPL on runs without per-token NLLs, a
--contrast or --matched that cannot be computed, checked before the report writes a file."""

import pytest
from conftest import posbench

pytestmark = pytest.mark.slow


def one_line(proc) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_longppl_on_runs_without_per_token_nlls_is_one_line(smoke_run_copy, tmp_path):
    (smoke_run_copy / "token_nll.npz").unlink()  # a run evaluated before they were stored
    out = tmp_path / "longppl.csv"
    line = one_line(posbench("longppl", smoke_run_copy, "--evaluator", smoke_run_copy, "--out", out, check=False))
    assert line == (f"posbench: error: longppl: {smoke_run_copy} hold(s) no ok validation row with its per-token NLL "
                    "in token_nll.npz (written by posbench eval since it stores them); valid: evaluate them again "
                    "(posbench eval checkpoint=RUN eval.recompute=true), or leave them out")
    assert not out.exists()


def test_a_contrast_or_matched_report_that_cannot_be_made_writes_nothing(smoke_run, tmp_path):
    out = tmp_path / "report"
    line = one_line(posbench("report", smoke_run, "--contrast", "alibi/rop", "--out", out, check=False))
    assert line == "posbench: error: report: --contrast alibi/rop: 'rop' is not a line of this report; valid: alibi"
    line = one_line(posbench("report", smoke_run, "--contrast", "{encoding: rop}/{encoding: alibi}", "--out", out,
                             check=False))
    assert line == "posbench: error: report: line key {encoding: rop} names no line; valid: a key of one line of alibi"
    line = one_line(posbench("report", smoke_run, "--contrast", "{colour: red}/alibi", "--out", out, check=False))
    assert line.startswith("posbench: error: report: line key field 'colour' is not a field of this report's lines; "
                           "valid: encoding, scaling, method")
    line = one_line(posbench("report", smoke_run, "--matched", "--out", out, check=False))
    assert line.startswith("posbench: error: report --matched: no line has runs at two or more budgets")
    assert not out.exists()


def test_a_report_into_a_folder_that_cannot_be_written_is_one_line(smoke_run, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = one_line(posbench("report", smoke_run, "--out", blocker / "report", check=False))
    assert line == (f"posbench: error: cannot write '{blocker / 'report'}': Not a directory; valid: a folder that can "
                    "be written to, with free space; each file posbench writes is replaced whole or not at all, so "
                    "what was there is unchanged")


def test_unigram_perplexity_is_add_one_smoothed_token_frequencies():
    import numpy as np

    from posbench.eval.ladder import unigram_perplexity

    # counts + 1 over the ids 0..2: 3, 2, 1 of 6 -> p = 1/2, 1/3, 1/6; ppl = (1/2 * 1/3 * 1/6) ** (-1/3) = 36 ** (1/3)
    assert unigram_perplexity(np.array([0, 0, 1]), np.array([0, 1, 2])) == pytest.approx(36 ** (1 / 3), rel=1e-12)


def test_a_line_that_learned_little_beyond_token_frequencies_gets_no_verdict(smoke_run, tmp_path):
    """experiment=smoke lands near the unigram perplexity of its text (about 336 against 374): its
    ratios of about 1.0 at every length would read 'within 10% up to 16x'."""
    import pandas as pd

    rows = pd.read_csv(smoke_run / "results.csv")
    assert rows.unigram_ppl.nunique() == 1 and 300 < rows.unigram_ppl.iloc[0] < 450
    posbench("report", smoke_run, "--out", tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "within 10%" not in text
    assert "- alibi: no extrapolation verdict: its ppl at train_len, " in text and "a verdict needs below 80%" in text
    assert "- verdict: not compared, having learned little beyond token frequencies" in text


def test_a_run_whose_config_yaml_does_not_parse_is_one_line(smoke_run_copy, tmp_path):
    config = smoke_run_copy / "config.yaml"
    lines = config.read_text().count("\n")
    config.write_text(config.read_text() + "encoding: [unclosed\n")  # edited by hand, and broken
    expected = (f"posbench: error: {config} line {lines + 2}, column 1: expected ',' or ']', but got '<stream end>' "
                "(not valid YAML); valid: the file as posbench wrote it (restore it from a copy, or train the run "
                "again)")
    assert one_line(posbench("eval", f"checkpoint={smoke_run_copy}", check=False)) == expected
    assert one_line(posbench("report", smoke_run_copy, "--out", tmp_path / "report", check=False)) == expected
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize("args, message", [
    (["--short", "0"], "longppl: --short 0 is not valid; valid: a length in tokens >= 1"),
    (["--long", "-4"], "longppl: --long -4 is not valid; valid: a length in tokens >= 1"),
    (["--alpha", "nan"], "longppl: --alpha nan is not valid; valid: a finite number (nats)"),
])
def test_longppl_options_are_checked_before_any_run_is_read(tmp_path, args, message):
    line = one_line(posbench("longppl", tmp_path / "nothing", "--evaluator", tmp_path, *args, check=False))
    assert line == f"posbench: error: {message}"
