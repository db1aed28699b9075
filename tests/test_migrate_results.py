"""Rows carry what ran at inference as data, and the shipped results were migrated to it without a
number changing (scripts/migrate_results.py, posbench.methods.Applied, the read-time shim
posbench.eval.results.with_method)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import compose, load_script, tiny_model

from posbench.config import EvalConfig
from posbench.errors import PosbenchError
from posbench.eval import results as results_module
from posbench.eval.ladder import perplexity_ladder, result_rows
from posbench.eval.results import METHOD, applied_from_label, read_results, write_results
from posbench.methods import Applied, Extension, methods, scalings
from posbench.runs.rundir import RunDir

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "migrate_results.py"
migrate_results = load_script("migrate_results")


def old_name(kind: str, ext: Extension) -> str:
    """The rows' name as posbench wrote it before the columns (the formula written out again)."""
    if ext.method == "none":
        return kind
    named = [(n, v) for n, v in zip(ext.params, (ext.window, ext.group)) if n]
    text = f"{ext.method}({','.join(f'{n}={v}' for n, v in named)})" if named else ext.method
    return text if kind == "none" else f"{kind}+{text}"


def every_method() -> list[Extension]:
    """Each built-in at its defaults, W = 32 and G = 4 where it has none."""
    found = []
    for name in methods():
        try:
            found.append(Extension(name, train_len=128))
        except PosbenchError:
            found.append(Extension(name, 32, 4, 128))
    return found


@pytest.mark.parametrize("kind", ["none", "yarn", "dynamic_ntk"])
def test_the_rows_name_renders_the_data_as_before_and_reads_back(kind):
    """Applied.label is the name rows were keyed by before they carried the columns, for every
    built-in method (its defaults resolved) with and without a scaling where it takes one; the
    shim reads each name back to the same data."""
    for ext in every_method():
        if ext.sets_positions and kind != "none":
            continue
        applied = Applied.of(kind, ext)
        assert applied.label == old_name(kind, ext)
        assert applied_from_label(applied.label) == applied or applied.method == applied.scaling == "llama3"
        cols = applied.columns()
        assert (cols["scaling"], cols["method"]) == (kind, ext.method)
        assert [cols["method_window"], cols["method_group"]] == [
            v if n else None for n, v in zip(tuple(ext.params) + (None, None), (ext.window, ext.group))]


def test_the_shim_reads_every_name_and_says_which_spelling_wins():
    assert applied_from_label("none") == Applied() == applied_from_label(math.nan)
    assert applied_from_label("yarn+logn") == Applied("yarn", "logn")
    assert applied_from_label("string(S=2703,W=128)") == Applied("none", "string", 2703, 128)
    assert applied_from_label("rerope(W=64)") == Applied("none", "rerope", 64, None)
    # llama3 is a method and a scaling (the same computation); rows were written as the method
    assert "llama3" in scalings() and applied_from_label("llama3") == Applied("none", "llama3")
    # a method this install lacks keeps its name and its values in order
    assert applied_from_label("mine(X=3,Y=4)") == Applied("none", "mine", 3, 4)


def test_an_evaluation_writes_the_columns_without_reading_a_name(tmp_path, monkeypatch):
    """The evaluator writes the columns from what it ran: with the shim made to fail, a
    Self-Extend ladder is written to results.csv and positions.csv with them, and read back."""
    def refuse(text):
        raise AssertionError(f"the writer read a name back: {text!r}")

    monkeypatch.setattr(results_module, "applied_from_label", refuse)
    cfg = compose("encoding=rope", "train.train_len=8")
    ecfg = EvalConfig(lengths=[8, 16], max_tokens=64, extension="self_extend", extension_window=4,
                      extension_group=2)
    tokens = np.random.default_rng(0).integers(0, 50, 200)
    ladder = perplexity_ladder(tiny_model("rope"), tokens, [8, 16], ecfg, torch.device("cpu"), None)
    write_results(RunDir(tmp_path), result_rows(cfg, ladder, 1))
    for rows in (pd.read_csv(tmp_path / "results.csv"), pd.read_csv(tmp_path / "positions.csv"),
                 read_results(tmp_path / "results.csv")):
        assert (rows.rope_scaling == "self_extend(W=4,G=2)").all() and (rows.method == "self_extend").all()
        assert (rows.scaling == "none").all() and (rows.method_window == 4).all() and (rows.method_group == 2).all()


def test_an_old_file_migrates_to_the_shims_reading_with_every_cell_kept(tmp_path):
    old = pd.DataFrame({"encoding": ["rope"] * 3, "rope_scaling": ["none", "self_extend(W=2048,G=8)", "yarn"],
                        "ppl": ["12.345678901234567", "nan", "1e-05"], "config_hash": ["28586650e810"] * 3})
    path = tmp_path / "results.csv"
    old.to_csv(path, index=False)
    before = path.read_text().splitlines()
    shim = read_results(path)[METHOD]
    assert migrate_results.main([str(tmp_path)]) == 0
    after = path.read_text().splitlines()
    assert all(b.startswith(a + ",") for a, b in zip(before, after)) and len(before) == len(after)
    assert after[0].endswith(",scaling,method,method_window,method_group")
    pd.testing.assert_frame_equal(read_results(path)[METHOD], shim)
    assert migrate_results.main([str(tmp_path), "--check"]) == 0 and not migrate_results.migrate(path)


def test_every_shipped_rows_file_is_migrated_with_its_numbers_unchanged():
    """Over every rows file shipped under results/ (the wheel's baselines among them): it carries
    the columns, its rows' names are the columns rendered, and migrating it again from its own
    text without the columns gives it back cell for cell (every number, every config hash)."""
    files = migrate_results.rows_files([ROOT / "results"])
    assert len(files) > 1000
    for path in files:
        text = migrate_results.read_text(path)
        assert all(c in text for c in METHOD), f"{path} is not migrated: python {SCRIPT.relative_to(ROOT)} results"
        again = migrate_results.migrated(text.drop(columns=METHOD))
        pd.testing.assert_frame_equal(again, text[list(again.columns)], obj=str(path))
        names = {(r.scaling, r.method, r.method_window, r.method_group): r.rope_scaling
                 for r in text.drop_duplicates(["rope_scaling", *METHOD]).itertuples()}
        for (kind, method, window, group), name in names.items():
            applied = Applied(kind, method, int(window) if window else None, int(group) if group else None)
            assert applied.label == name, path


def test_the_script_refuses_a_missing_dir_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "nope")], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "does not exist" in out.stderr
