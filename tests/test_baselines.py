"""Shipped baselines: a run exported to per-block NLL sums reports exactly as the run itself,
and a new run is reported beside an exported one with the same paired intervals as beside the
run dir (posbench.report.baselines)."""

import numpy as np
import pandas as pd
import pytest
from conftest import posbench

from posbench.errors import PosbenchError
from posbench.report.baselines import BLOCKS_FILE, export_baseline, resolve_baseline, run_blocks
from posbench.report.build import report

pytestmark = pytest.mark.slow
INTERVALS = ["ppl_mean", "ppl_ci_low", "ppl_ci_high", "ci_method", "ratio_ci_low", "ratio_ci_high", "ratio_method",
             "vs_best", "vs_best_ci_low", "vs_best_ci_high", "tied_best"]


@pytest.fixture
def rope_run(smoke_rope_run):
    return smoke_rope_run


def test_an_exported_run_keeps_its_block_sums_in_a_few_kib(smoke_run, tmp_path):
    written = export_baseline([smoke_run], tmp_path / "bundle")
    assert [p.relative_to(tmp_path / "bundle").as_posix() for p in written] == ["alibi/run"]
    assert sorted(p.name for p in written[0].iterdir()) == [BLOCKS_FILE, "config.yaml", "positions.csv", "results.csv"]
    assert (written[0] / "positions.csv").read_bytes() == (smoke_run / "positions.csv").read_bytes()
    assert (written[0] / BLOCKS_FILE).stat().st_size < 8192 < (smoke_run / "token_nll.npz").stat().st_size
    here, there = run_blocks(smoke_run), run_blocks(written[0])
    assert here.keys() == there.keys() and len(here) == len(pd.read_csv(smoke_run / "results.csv"))
    for key in here:
        np.testing.assert_array_equal(here[key][0], there[key][0])  # float64 sums, bit for bit
        np.testing.assert_array_equal(here[key][1], there[key][1])


def test_a_run_beside_a_baseline_reports_as_beside_the_baseline_run_itself(smoke_run, rope_run, tmp_path):
    bundle = tmp_path / "bundle"
    export_baseline([smoke_run], bundle)
    direct = report([rope_run, smoke_run], tmp_path / "direct", reference=None).summary
    shipped = report([rope_run], tmp_path / "shipped", reference=None, baselines=[bundle]).summary
    assert set(shipped.encoding) == {"alibi", "rope"}
    pd.testing.assert_frame_equal(direct[INTERVALS].reset_index(drop=True), shipped[INTERVALS].reset_index(drop=True))
    assert (shipped.ci_method == "text (1 seed)").all() and shipped.vs_best_ci_low.notna().all()  # paired blocks
    # the CLI: --baseline DIR, and --export-baseline
    out = tmp_path / "cli"
    proc = posbench("report", rope_run, "--baseline", bundle, "--out", out, "--no-reference")
    assert "| alibi" in proc.stdout and "| rope" in proc.stdout
    again = posbench("report", smoke_run, "--export-baseline", tmp_path / "again")
    assert "wrote 1 run(s)" in again.stdout and (tmp_path / "again" / "alibi" / "run" / BLOCKS_FILE).is_file()


def test_an_unknown_baseline_is_one_line_naming_the_shipped_ones(tmp_path):
    with pytest.raises(PosbenchError, match=r"^report: --baseline 'nosuch' is neither a shipped baseline nor a "
                                            r"directory; valid: .* or a folder made by posbench report --export"):
        resolve_baseline("nosuch")
    proc = posbench("report", tmp_path, "--baseline", "nosuch", check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["zoo_quick", "headline"])
def test_the_shipped_baseline_is_found_by_name_and_reports_its_shipped_table(tmp_path, name):
    """`--baseline NAME` resolves to results/baselines/NAME (posbench/baselines in a wheel), and
    its 15 runs (five encodings, three seeds) report the numbers its README and report.csv ship."""
    from posbench.report.baselines import shipped_baselines

    assert name in shipped_baselines()
    bundle = resolve_baseline(name)
    assert len(list(bundle.rglob(BLOCKS_FILE))) == 15
    summary = report([], tmp_path, reference=None, baselines=[bundle]).summary
    shipped = pd.read_csv(bundle / "report" / "report.csv")
    columns = ["label", "eval_len", "ppl_mean", "ppl_ci_low", "ppl_ci_high", "ratio_ci_low", "ratio_ci_high"]
    pd.testing.assert_frame_equal(summary[columns].reset_index(drop=True), shipped[columns].reset_index(drop=True),
                                  check_dtype=False)
