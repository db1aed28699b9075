"""Every current LM table under results/ carries the current interval estimator (posbench/intervals.py).

Which files are checked: every CSV under results/ whose header has the ``posbench report`` schema
(``ppl_mean``, ``ppl_ci_low``, ``ppl_ci_high`` and ``ci_method``), outside the folders listed under
"Retired tables" in results/README.md (parsed here: each item's first link text is a folder of
results/). Other schemas are not LM report tables and are skipped: a run's own ``results.csv`` and
``positions.csv`` (per seed, no intervals), the task report ``tasks_report.csv`` (``exact_method``:
Wilson or a pooled t over instances), probe tables ``probes.csv`` (``score``, ``ci_low``), ``context.csv``
(a gain in nats per context, ``method``), the budget study's per-seed ``budget.csv`` (``ppl``, no
``ppl_mean``), ``bench.csv`` and the published reference perplexities.

The rules, per row of a checked table:

1. ``ci_method`` and ``ratio_method`` (where the column exists) name a current LM method:
   ``seeds+text``, ``text (1 seed)``, ``t`` (seeds only, runs without per-token NLL) or ``none``; an
   old one (``bootstrap``, ``paired t``, ...) fails.
2. A point estimate lies inside its own interval, where the interval is given: ``ppl_mean`` in
   [``ppl_ci_low``, ``ppl_ci_high``], ``ratio_mean`` in [``ratio_ci_low``, ``ratio_ci_high``] and
   ``vs_best`` in [``vs_best_ci_low``, ``vs_best_ci_high``], with a relative tolerance of 1e-9 (the
   current intervals are centred on the estimate on the log scale; the percentile bootstrap around
   an arithmetic mean could leave it outside).
3. A line of exactly 2 seeds with ``ci_method`` ``seeds+text`` has an interval at least as wide as
   its seeds' range: ``ppl_min`` and ``ppl_max`` inside [``ppl_ci_low``, ``ppl_ci_high``] (same
   tolerance; two seeds that agree by chance must not give an interval narrower than the seeds).

And a shipped table is what the code computes today: the headline study's report command, run again
on its shipped runs, gives its report.csv to 1e-9.
"""

from __future__ import annotations

import csv
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT

from posbench.study import load_study, report_command

RESULTS = ROOT / "results"
ALLOWED = {"seeds+text", "text (1 seed)", "t", "none"}
SCHEMA = {"ppl_mean", "ppl_ci_low", "ppl_ci_high", "ci_method"}
TOL = 1e-9
# the reports the current estimator produced: the walk must find them, or it checks nothing
CURRENT = ["headline/report.csv", "zoo/report.csv", "new_schemes/report.csv", "scale/report.csv",
           "baselines/headline/report/report.csv", "baselines/zoo_quick/report/report.csv"]


def retired_folders(readme: Path) -> list[str]:
    """The folders (relative to results/) listed under the "Retired tables" heading of ``readme``:
    the first link text of each "- " item, up to the next heading."""
    folders, inside = [], False
    for line in readme.read_text().splitlines():
        if line.startswith("#"):
            inside = line.lstrip("#").strip().lower() == "retired tables"
            continue
        match = re.match(r"\s*- \**\[([^\]]+)\]", line) if inside else None
        if match:
            folders.append(match.group(1).strip().strip("/"))
    return folders


def lm_tables(root: Path, retired: list[str]) -> list[Path]:
    """Every CSV under ``root`` with the LM report schema, outside the retired folders."""
    found = []
    for path in sorted(root.rglob("*.csv")):
        rel = path.relative_to(root).as_posix()
        if any(rel == f or rel.startswith(f + "/") for f in retired):
            continue
        with path.open(newline="") as fh:
            header = next(csv.reader(fh), [])
        if SCHEMA <= set(header):
            found.append(path)
    return found


def _num(value: str | None) -> float:
    try:
        return float(value) if value not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _inside(x: float, low: float, high: float) -> bool:
    tol = TOL * max(1.0, abs(x), abs(low), abs(high))
    return low - tol <= x <= high + tol


def check_table(path: Path) -> list[str]:
    """The rows of one LM report table that break a rule (module docstring), one message each."""
    bad = []
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    for i, row in enumerate(rows, start=2):  # line 1 is the header
        where = f"{path}:{i} ({row.get('label', '?')}, eval_len {row.get('eval_len', '?')})"
        for col in ("ci_method", "ratio_method"):
            if col in row and row[col] not in ALLOWED:
                bad.append(f"{where}: {col} {row[col]!r} is not a current LM method {sorted(ALLOWED)}")
        for est, low, high in (("ppl_mean", "ppl_ci_low", "ppl_ci_high"),
                               ("ratio_mean", "ratio_ci_low", "ratio_ci_high"),
                               ("vs_best", "vs_best_ci_low", "vs_best_ci_high")):
            x, lo, hi = _num(row.get(est)), _num(row.get(low)), _num(row.get(high))
            if math.isnan(x) or math.isnan(lo) or math.isnan(hi):
                continue
            if not _inside(x, lo, hi):
                bad.append(f"{where}: {est} {x:.6g} outside its interval [{lo:.6g}, {hi:.6g}]")
        seeds, n_ok = _num(row.get("seeds")), _num(row.get("n_ok"))
        if seeds == 2 and (math.isnan(n_ok) or n_ok == 2) and row.get("ci_method") == "seeds+text":
            lo, hi = _num(row.get("ppl_ci_low")), _num(row.get("ppl_ci_high"))
            for col in ("ppl_min", "ppl_max"):
                x = _num(row.get(col))
                if not math.isnan(x) and not _inside(x, lo, hi):
                    bad.append(f"{where}: 2 seeds, {col} {x:.6g} outside the interval [{lo:.6g}, {hi:.6g}] "
                               "(narrower than the seeds' range)")
    return bad


# ---------------------------------------------------------------- the repository's tables
def test_retired_list_is_parsed_and_each_folder_says_so():
    retired = retired_folders(RESULTS / "README.md")
    assert retired, "results/README.md has no 'Retired tables' list"
    for folder in retired:
        readme = RESULTS / folder / "README.md"
        assert readme.is_file(), f"retired folder {folder} has no README.md"
        head = readme.read_text().splitlines()[:3]
        assert any("Superseded" in line for line in head), f"{readme} does not open with its 'Superseded' notice"
    for current in CURRENT:
        assert not any(current.startswith(f + "/") for f in retired), f"{current} is listed as retired"


def test_current_lm_tables_carry_the_current_estimator():
    tables = lm_tables(RESULTS, retired_folders(RESULTS / "README.md"))
    found = {p.relative_to(RESULTS).as_posix() for p in tables}
    assert set(CURRENT) <= found, f"not found as LM report tables: {sorted(set(CURRENT) - found)}"
    bad = [msg for path in tables for msg in check_table(path)]
    assert not bad, "\n".join(bad[:40])


def test_other_schemas_are_not_read_as_lm_tables():
    tables = {p.name for p in lm_tables(RESULTS, [])}
    assert not tables & {"tasks_report.csv", "probes.csv", "context.csv", "budget.csv", "bench.csv",
                         "results.csv", "positions.csv", "alibi_paper_L512.csv"}


# ---------------------------------------------------------------- the rules catch what they should
HEADER = ["label", "train_len", "eval_len", "ppl_mean", "ppl_min", "ppl_max", "n_ok", "seeds", "ppl_ci_low",
          "ppl_ci_high", "ci_method", "ratio_mean", "ratio_ci_low", "ratio_ci_high", "ratio_method"]
GOOD = ["rope", "128", "128", "50.0", "49.0", "51.0", "2", "2", "40.0", "60.0", "seeds+text", "1.0", "1.0", "1.0",
        "seeds+text"]


def _write(path: Path, *rows: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows([HEADER, *rows])
    return path


def _with(**changes) -> list[str]:
    row = dict(zip(HEADER, GOOD))
    row.update(changes)
    return [row[c] for c in HEADER]


def test_a_good_synthetic_table_passes(tmp_path):
    assert check_table(_write(tmp_path / "report.csv", GOOD, _with(ci_method="t", seeds="3", n_ok="3"))) == []


@pytest.mark.parametrize("changes, message", [
    ({"ppl_mean": "61.0"}, "ppl_mean 61 outside"),
    ({"ppl_mean": "39.9", "ppl_min": "39.9"}, "ppl_mean 39.9 outside"),
    ({"ratio_mean": "1.2", "ratio_ci_low": "0.9", "ratio_ci_high": "1.1", "eval_len": "512"}, "ratio_mean 1.2 outside"),
    ({"ci_method": "bootstrap"}, "ci_method 'bootstrap'"),
    ({"ratio_method": "paired t"}, "ratio_method 'paired t'"),
    ({"ppl_min": "45.0", "ppl_max": "55.0", "ppl_ci_low": "47.0", "ppl_ci_high": "53.0"}, "ppl_min 45 outside"),
])
def test_a_broken_synthetic_table_fails(tmp_path, changes, message):
    bad = check_table(_write(tmp_path / "report.csv", GOOD, _with(**changes)))
    assert len(bad) >= 1 and message in bad[0], bad


def test_three_seeds_need_not_cover_their_range(tmp_path):
    row = _with(seeds="3", n_ok="3", ppl_min="45.0", ppl_max="55.0", ppl_ci_low="47.0", ppl_ci_high="53.0")
    assert check_table(_write(tmp_path / "report.csv", row)) == []


def test_an_estimate_moved_outside_in_a_copy_of_results_fails(tmp_path):
    """A copy of a current report with one estimate past its interval: the walk finds and flags it,
    and a retired folder's table is not read."""
    src = RESULTS / "headline" / "report.csv"
    dst = tmp_path / "results" / "headline" / "report.csv"
    dst.parent.mkdir(parents=True)
    shutil.copy(src, dst)
    root = tmp_path / "results"
    assert [msg for p in lm_tables(root, []) for msg in check_table(p)] == []
    with dst.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows[0]["ppl_mean"] = repr(float(rows[0]["ppl_ci_high"]) * 1.01)
    with dst.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    bad = [msg for p in lm_tables(root, []) for msg in check_table(p)]
    assert len(bad) == 1 and "ppl_mean" in bad[0] and "outside its interval" in bad[0]
    assert lm_tables(root, ["headline"]) == []


def test_retired_folders_are_parsed_from_the_list(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# Results\n\n- [zoo](zoo/README.md): current\n\n## Retired tables\n\n"
                      "- [cpu_quick](cpu_quick/README.md): old estimator\n"
                      "- **[ablations](ablations/README.md)**: old estimator\n\n## What each one found\n\n"
                      "- [headline](headline/README.md): current\n")
    assert retired_folders(readme) == ["cpu_quick", "ablations"]


# ---------------------------------------------------------------- shipped tables are the code's output today
def test_a_shipped_report_is_what_the_headline_study_s_report_computes_now(tmp_path):
    """The study's report command, run on its shipped runs into a scratch folder, gives the shipped
    report.csv to 1e-9: a change to the estimator (or anything upstream of a table) that leaves the
    shipped tables behind fails here until they are regenerated (`posbench study NAME --step report`).
    The headline: the table to cite."""
    study = load_study("headline", [])
    cmd = report_command(study)
    cmd[cmd.index("--out") + 1] = str(tmp_path)
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    assert_same_table(pd.read_csv(tmp_path / "report.csv"), pd.read_csv(study.results / "report.csv"),
                      study.results / "report.csv")


def assert_same_table(now: pd.DataFrame, shipped: pd.DataFrame, where) -> None:
    """The same columns and rows: floats to a relative TOL, the rest as text."""
    assert list(now.columns) == list(shipped.columns) and len(now) == len(shipped), where
    for col in shipped.columns:
        if pd.api.types.is_float_dtype(shipped[col]):
            assert np.allclose(now[col], shipped[col], rtol=TOL, atol=0, equal_nan=True), \
                f"{where}: {col} differs from what the report computes now"
        else:
            assert now[col].astype(str).tolist() == shipped[col].astype(str).tolist(), f"{where}: {col}"


@pytest.mark.parametrize("summary, rows", [
    ("pretrained/smollm2-135m/longppl.csv", "pretrained/smollm2-135m/runs/longppl.csv"),
    ("pretrained/smollm2-135m/longppl_short2048.csv", "pretrained/smollm2-135m/runs/longppl_short2048.csv"),
    ("pretrained/gemma3-270m/longppl.csv", "pretrained/gemma3-270m/runs/longppl.csv"),
])
def test_a_shipped_longppl_summary_is_what_the_report_computes_now_from_its_rows(summary, rows):
    """Each shipped LongPPL summary (the report's, a study's sensitivity's) is
    :func:`longppl_summary` of its shipped rows today, intervals included, to 1e-9: a change to the
    LongPPL estimator or its line labels that leaves a shipped table behind fails here."""
    from posbench.report.longppl import longppl_summary, summary_table

    kept = pd.read_csv(RESULTS / rows)
    now = summary_table(longppl_summary(kept[kept.key_tokens > 0]))
    assert_same_table(now, pd.read_csv(RESULTS / summary), summary)
