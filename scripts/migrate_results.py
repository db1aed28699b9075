"""Give every posbench rows file under the given dirs the method columns.

Rows name what ran at inference as data (:class:`posbench.methods.Applied`: ``scaling``,
``method``, ``method_window``, ``method_group``) beside the ``rope_scaling`` name they are keyed
by. Files written before those columns read them through posbench's read-time shim
(:func:`posbench.eval.results.with_method`); this script writes them into the files themselves,
so a shipped file holds its identity as data and is read without parsing a name. Every cell a
file had is written back as the same text (the file is read and written as text, never as
numbers), and the columns it gains are appended at the end; a file that has them is left as it
is.

A rows file is a CSV with ``encoding`` and ``rope_scaling`` columns and no ``label`` column
(results.csv, positions.csv, passkey.csv, a probe's CSV, longppl*.csv); a report's outputs
(report.csv, which holds ``label``) are the report's to regenerate.

    python scripts/migrate_results.py results            # migrate every rows file under results/
    python scripts/migrate_results.py results --check    # exit 1 naming the files not yet migrated
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import pandas as pd

from posbench.eval.results import METHOD, applied_from_label
from posbench.runs.rundir import atomic_write_text


def is_rows_file(path: Path) -> bool:
    """Whether ``path`` is a CSV of rows keyed by a ``rope_scaling`` name (module docstring)."""
    with open(path, newline="") as f:
        header = next(csv.reader(f), [])
    return "encoding" in header and "rope_scaling" in header and "label" not in header


def rows_files(dirs: list[Path]) -> list[Path]:
    """Every rows file under ``dirs`` (each once, sorted)."""
    found = {p.resolve(): p for d in dirs for p in (sorted(d.rglob("*.csv")) if d.is_dir() else [d])}
    return [p for p in found.values() if is_rows_file(p)]


def read_text(path: Path) -> pd.DataFrame:
    """A CSV as text, every cell as written (no number parsing, no NA)."""
    return pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False)


def migrated(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (text, :func:`read_text`) with the :data:`METHOD` columns it lacks appended, each
    row's from its ``rope_scaling`` name; integers as text, '' where the method has no such
    parameter. Cells already there are not touched."""
    missing = [c for c in METHOD if c not in frame]
    if not missing:
        return frame
    applied = {name: applied_from_label(name).columns() for name in frame.rope_scaling.unique()}
    out = frame.copy()
    for col in missing:
        out[col] = pd.Series([("" if applied[n][col] is None else str(applied[n][col])) for n in frame.rope_scaling],
                             index=frame.index, dtype=frame.rope_scaling.dtype)
    return out


def migrate(path: Path) -> bool:
    """Migrate one file in place (atomically). -> whether it changed."""
    frame = read_text(path)
    new = migrated(frame)
    if new is frame:
        return False
    atomic_write_text(path, new.to_csv(index=False))
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="run dirs, sweep dirs or study results to migrate")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming the files to migrate")
    ns = parser.parse_args(argv)
    if bad := [str(d) for d in ns.dirs if not d.exists()]:
        print(f"migrate_results: {bad[0]!r} does not exist; valid: run or results dirs", file=sys.stderr)
        return 2
    files = rows_files(ns.dirs)
    if ns.check:
        todo = [p for p in files if any(c not in read_text(p).columns for c in METHOD)]
        for p in todo:
            print(f"not migrated: {p}")
        print(f"{len(files) - len(todo)} of {len(files)} rows files carry the method columns")
        return 1 if todo else 0
    changed = sum(migrate(p) for p in files)
    print(f"{changed} of {len(files)} rows files migrated ({len(files) - changed} had the columns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
