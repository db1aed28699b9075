"""The results schema and its files: one place for columns, keys, labels and merges.

results.csv holds one row per ``KEY`` (encoding, scaling, train_len, eval_len, seed, split and
protocol) with the ``COLUMNS`` below; positions.csv the binned loss by position of the same keys
(``POSITION_COLUMNS``); an algorithmic task's run dir holds tasks.csv instead, one row per
evaluated instance size (``TASK_COLUMNS``). :func:`find_files` finds any of them under run or
sweep dirs. Files written before a column existed read with its neutral value
(:func:`backfill`). Every writer merges under :func:`locked`, so jobs writing one run dir at the
same time keep each other's rows. Each row belongs to one figure/table line, named by
:func:`line_label`.

The evaluator computes rows and hands them here; drawing is the report stage's, called last by
the command that asked (:func:`posbench.report.build.draw_run`).
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import PosbenchError
from ..methods import Applied, methods, scalings
from ..runs.rundir import RunDir, atomic_write_text
from .token_nll import FILE as TOKEN_NLL
from .token_nll import merge_token_nll

KEY = ["encoding", "rope_scaling", "train_len", "eval_len", "seed", "split", "mode", "stride"]
# what ran at inference, as data (posbench.methods.Applied): ``rope_scaling`` above is its rendered name
METHOD = list(Applied.COLUMNS)
COLUMNS = KEY + ["rope_factor", "ppl", "nll", "bpb", "word_ppl", "tokens", "bytes", "words", "status",
                 "model", "data", "steps", "init_len", "params", "pos_params", "config_hash", "code_version",
                 "unigram_ppl", "execution"] + METHOD
POSITION_COLUMNS = KEY + ["bin_start", "bin_end", "nll", "tokens", "config_hash", "code_version"] + METHOD
LINE = ["label", "model", "data", "train_len", "split"]  # one table row / one figure line
# tasks.csv: random_positions 0 = positions 0..T-1, L > 0 = positions drawn from [0, L); multiple =
# eval_size / train_size; exact_* and token_* are over the row's instances (Wilson, t; in [0, 1])
TASK_COLUMNS = ["task", "encoding", "random_positions", "train_size", "eval_size", "multiple", "seed", "step",
                "instances", "exact_match", "exact_lo", "exact_hi", "token_acc", "token_sd", "token_lo",
                "token_hi", "params", "config_hash"]
RESULTS, TASKS = "results.csv", "tasks.csv"


# ---------------------------------------------------------------- reading
def find_files(paths: list[str | Path], name: str) -> list[Path]:
    """Every ``name`` under ``paths`` (dirs searched recursively), each file once. A file given
    stands for itself when it is called ``name``, else for its dir; a file given for results.csv
    stands for itself whatever its name (a renamed copy), unless it is a tasks.csv."""
    found: dict[Path, Path] = {}
    for p in map(Path, paths):
        if not p.exists():
            raise PosbenchError(f"report: {str(p)!r} does not exist")
        if p.is_file():
            itself = p.name == name or (name == RESULTS and p.name != TASKS)
            candidates = [p] if itself else [p.parent / name]
        else:
            candidates = sorted(p.rglob(name))
        for f in candidates:
            if f.is_file():
                found.setdefault(f.resolve(), f)
    return list(found.values())


def report_dir(paths: list[str | Path], out: str | Path | None = None) -> Path:
    """Where a report of ``paths`` goes: ``out``, else the single directory given, else ./report."""
    if out is not None:
        return Path(out)
    return Path(paths[0]) if len(paths) == 1 and Path(paths[0]).is_dir() else Path("report")


def backfill(df: pd.DataFrame) -> pd.DataFrame:
    """Rows written before the evaluation protocols read as nonoverlapping, stride = eval_len,
    bpb, word_ppl, bytes and words unknown; before RoPE scaling as rope_scaling none, factor 1;
    before parameter counts with params and pos_params unknown; before the unigram baseline with
    ``unigram_ppl`` unknown, before the execution record with ``execution`` unknown; ``init_len``
    (the parent run's train_len of a fine-tuned run) is empty for every run trained from scratch."""
    df = df.copy()
    defaults = {"rope_scaling": "none", "rope_factor": 1.0, "mode": "nonoverlapping", "stride": df.get("eval_len"),
                "bpb": math.nan, "word_ppl": math.nan, "bytes": math.nan, "words": math.nan,
                "params": math.nan, "pos_params": math.nan, "init_len": math.nan, "unigram_ppl": math.nan,
                "execution": math.nan}
    for col, value in defaults.items():
        df[col] = value if col not in df else df[col].fillna(value)
    for col in ("stride", "bytes", "words", "params", "pos_params", "init_len"):
        df[col] = df[col].astype("Int64")
    for col in ("bpb", "word_ppl", "unigram_ppl"):
        df[col] = df[col].astype(float)
    df = with_method(df)
    return df[[c for c in COLUMNS if c in df] + [c for c in df if c not in COLUMNS]]


def with_method(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its rows' :data:`METHOD` columns: as written where a row has them; rows written
    before them (old run dirs, and any file not yet migrated by scripts/migrate_results.py) read
    them from their ``rope_scaling`` name (:func:`applied_from_label`)."""
    if "rope_scaling" not in df:
        return df
    df = df.copy()
    missing = df["method"].isna() if "method" in df else pd.Series(True, index=df.index)
    if missing.any():
        cache: dict[str, dict] = {}
        parsed = [cache.setdefault(t, applied_from_label(t).columns()) for t in df.rope_scaling[missing]]
        for col in METHOD:
            values = pd.Series([p[col] for p in parsed], index=df.index[missing], dtype=object)
            df[col] = values if col not in df else df[col].astype(object).where(~missing, values)
    for col in METHOD[:2]:  # text as its key's (read or made)
        df[col] = df[col].astype(df.rope_scaling.dtype)
    for col in METHOD[2:]:
        df[col] = pd.to_numeric(df[col]).astype("Int64")
    return df


def as_trained(frame: pd.DataFrame) -> pd.Series:
    """Which rows are of the model as trained (no RoPE scaling and no method), from the
    :data:`METHOD` columns (through :func:`with_method` where ``frame`` lacks them)."""
    if not all(c in frame for c in METHOD[:2]):
        if "rope_scaling" not in frame:
            return pd.Series(True, index=frame.index)
        frame = with_method(frame)
    return (frame.scaling.fillna("none") == "none") & (frame.method.fillna("none") == "none")


def applied_from_label(text) -> Applied:
    """The read-time shim, the one place a row's name is read back into its parts: a
    ``rope_scaling`` name written before rows carried :data:`METHOD` (``none``, ``yarn``,
    ``self_extend(W=512,G=8)``, ``yarn+logn``) -> what it names. A name that is both a method and
    a scaling (``llama3``: the same computation either way) reads as the method, the spelling rows
    were written under; a method this install lacks keeps its name and its values in order."""
    if not isinstance(text, str) or text in ("", "none"):
        return Applied()
    kind, _, rest = text.rpartition("+")
    head, _, params = rest.partition("(")
    known = methods()
    if not kind and head not in known and head in scalings():
        return Applied(scaling=head)
    values = [int(v.split("=", 1)[1]) for v in params.rstrip(")").split(",") if "=" in v]
    names = tuple(known[head].params) + (None, None) if head in known else ("window", "group")
    fields = dict(zip([f for f, name in zip(("window", "group"), names) if name], values))
    return Applied(scaling=kind or "none", method=head, **fields)


#: Columns of identifiers, read as the text they were written as: a 12-digit config hash that is
#: all digits, or digits around one "e" ("28586650e810"), would otherwise read as a number: no
#: longer equal to the hash it names, nor written back as it was.
TEXT_COLUMNS = ("config_hash", "code_version", "init_hash", "sweep_hash", "execution")
BY = "by:"  # a --by key's column (``by:train.steps``): each row's value as text, NA where its run's config lacks it


def read_table(path: str | Path, **kwargs) -> pd.DataFrame:
    """One of posbench's CSV files (results, positions, LongPPL, tasks, probes, a report's summary),
    its identifier columns (:data:`TEXT_COLUMNS`) and ``--by`` values (``by:`` columns: '64', not
    64.0 beside a run that lacks the key) as text; ``kwargs`` go to :func:`pandas.read_csv`."""
    by = [c for c in pd.read_csv(path, nrows=0).columns if c.startswith(BY)]
    return pd.read_csv(path, dtype={c: str for c in (*TEXT_COLUMNS, *by)}, **kwargs)


def read_results(path: str | Path) -> pd.DataFrame:
    """One results.csv, backfilled (see :func:`backfill`)."""
    return backfill(read_table(path))


def _scaling_order(col: pd.Series) -> pd.Series:
    return ("1" + col).where(col != "none", "0") if col.name == "rope_scaling" else col  # none first


def sort_rows(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Sorted by ``by``, unscaled rows before the scalings of the same encoding."""
    return df.sort_values([c for c in by if c in df], key=_scaling_order).reset_index(drop=True)


# ---------------------------------------------------------------- labels
def line_label(encoding: str, rope_scaling: str = "none", mode: str = "nonoverlapping", stride="",
               variant: str = "") -> str:
    """'rope', 'rope+yarn' under a scaling, 'alibi sliding/64' for sliding windows of stride 64
    ('alibi sliding/L/2' for a stride of half the window at every length), and the run's
    ``variant`` in brackets where the report was asked to tell runs apart by config keys
    ('t5 [bias_scale=none]', see :func:`variant_of`)."""
    label = encoding if pd.isna(rope_scaling) or rope_scaling == "none" else f"{encoding}+{rope_scaling}"
    if mode == "sliding":
        label = f"{label} sliding/{stride if isinstance(stride, str) else int(stride)}"
    return f"{label} [{variant}]" if isinstance(variant, str) and variant else label




def by_columns(frame: pd.DataFrame) -> list[str]:
    """The ``--by`` keys' columns of ``frame`` (:data:`BY`), in the order the keys were given."""
    return [c for c in frame.columns if isinstance(c, str) and c.startswith(BY)]


def by_values(config: dict, keys: list[str]) -> dict[str, str | None]:
    """Each dotted key's value in a run's flattened ``config`` as text (None where it lacks the key):
    the data :func:`variant_of` renders and :func:`relabel` renders again from."""
    return {f"{BY}{k}": (str(config[k]) if k in config else None) for k in keys}


def variant_of(values: dict, drop: set[str] | frozenset = frozenset()) -> str:
    """'bias_scale=none, steps=800' from one row's ``by:`` values (:func:`by_values`), each key by
    its last component, those in ``drop`` (dotted keys) left out. A key the run's config lacks (an
    option of another encoding, ``bias_scale`` on an alibi run; a key the run predates) is left
    out, not written 'unset': 'alibi [steps=488]', where 'alibi [steps=488, bias_scale=unset]' said
    nothing about alibi. Lines stay apart: two runs that differ only there differ by the key one of
    them sets. Wherever a key's value is read (``--per``), its absence reads 'unset'."""
    return ", ".join(f"{c[len(BY):].rsplit('.', 1)[-1]}={v}" for c, v in values.items()
                     if c[len(BY):] not in drop and isinstance(v, str))


def relabel(frame: pd.DataFrame, drop: set[str] | frozenset = frozenset()) -> pd.Series:
    """Each row's line label rendered again from its data with the ``--by`` keys ``drop`` left out
    of its variant (a ``--per`` key, or a value most lines share): never read back from a label."""
    cols = by_columns(frame)
    variants = [variant_of(dict(zip(cols, row)), drop) for row in frame[cols].itertuples(index=False)] if cols \
        else list(frame["variant"] if "variant" in frame else [""] * len(frame))
    return with_labels(frame.assign(variant=variants)).label


def shared_value(values: pd.Series):
    """The value most of ``values`` have (strictly more than any other), where every one has a
    value; None otherwise (no values, one missing, or a tie)."""
    if not len(values) or values.isna().any():
        return None
    counts = values.value_counts()
    return counts.index[0] if len(counts) == 1 or counts.iloc[0] > counts.iloc[1] else None


def compact_names(rows: pd.DataFrame, judged: list[str] | None = None) -> tuple[dict[str, str], str]:
    """Line names whose ``--by`` values repeat what most lines share, shortened, from the rows' data:
    ``rows`` hold each line's rows (every length: the labels' stride tags are their own), with its
    ``name`` (the label and any suffix a figure adds, :func:`line_names`), ``label`` and ``by:``
    columns (:func:`by_values`). A key's value most of the lines have (strictly more than any
    other value), of a key every line has, is left out of each line that has it, and brackets
    left empty go (a key some line lacks, an option of one encoding, stays: 'unless shown: k=v'
    would be false of that line), so a zoo's ``rope [length_scaling=none, qk_norm=False,
    window=128]`` reads ``rope [window=128]``. ``judged``: the names that decide what is shared
    (default: all). -> (name -> its short name, and 'length_scaling=none, ...' naming what was
    left out, for a legend's title; '' when nothing was). Distinct lines stay distinct."""
    cols = by_columns(rows)
    lines = rows.drop_duplicates("name")
    decide = lines if judged is None else lines[lines.name.isin(set(judged))]
    common = {c[len(BY):]: value for c in cols if (value := shared_value(decide[c])) is not None}
    if not common:
        return {name: name for name in lines.name}, ""
    variants = [variant_of(dict(zip(cols, row)), {k for k, v in common.items() if row[cols.index(BY + k)] == v})
                for row in rows[cols].itertuples(index=False)]
    shortened = with_labels(rows.assign(variant=variants)).label
    short = {name: new + name[len(label):] for name, label, new in zip(rows.name, rows.label, shortened)}
    return short, ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in common.items())


def stride_tags(df: pd.DataFrame) -> pd.Series:
    """How each sliding row names its stride: the number when the line (encoding, scaling, model,
    data, train_len, split) slides by one stride at every length, 'L/k' when its stride is
    eval_len // k at every length (``eval.stride=null`` is L/2), else the row's own stride."""
    tags = df.stride.astype(object)
    line = [c for c in ("encoding", "rope_scaling", "model", "data", "train_len", "split") if c in df]
    sliding = df[df["mode"] == "sliding"]
    for _, g in sliding.groupby(line, dropna=False) if len(sliding) else []:
        if g.stride.nunique() > 1:
            for k in sorted(set(g.eval_len // g.stride)):
                if k >= 1 and (g.stride == (g.eval_len // k).clip(lower=1)).all():
                    tags[g.index] = f"L/{k}"
                    break
    return tags


def with_labels(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with each row's line ``label`` (scaling and mode columns backfilled where absent, and
    an empty ``variant`` where the rows have none)."""
    df = df.assign(rope_scaling=df.rope_scaling.fillna("none") if "rope_scaling" in df else "none",
                   mode=df["mode"].fillna("nonoverlapping") if "mode" in df else "nonoverlapping")
    if "stride" not in df:
        df = df.assign(stride=df.eval_len if "eval_len" in df else 0)
    if "variant" not in df:
        df = df.assign(variant="")
    labels = [line_label(*row) for row in zip(df.encoding, df.rope_scaling, df["mode"], stride_tags(df), df.variant)]
    return df.assign(label=pd.Series(labels, index=df.index, dtype=object))


def line_names(frame: pd.DataFrame) -> pd.Series:
    """Each row's figure line: its label, plus ``(model=..., train_len=...)`` for the LINE
    columns that vary across ``frame``."""
    varied = [c for c in LINE[1:] if c in frame and frame[c].nunique() > 1]
    if not varied:
        return frame.label
    suffix = frame[varied].astype(str).apply(lambda r: ", ".join(f"{c}={v}" for c, v in r.items()), axis=1)
    return frame.label + " (" + suffix + ")"



def markdown_results(rows: pd.DataFrame) -> str:
    """One run's rows as a Markdown table."""
    lines = ["| encoding | train_len | eval_len | ppl | nll | tokens | status |", "|---|---|---|---|---|---|---|"]
    for r in with_labels(rows).itertuples():
        status = r.status if len(r.status) < 60 else r.status[:57] + "..."
        lines.append(f"| {r.label} | {r.train_len} | {r.eval_len} | {r.ppl:.2f} | {r.nll:.4f} | {r.tokens} "
                     f"| {status} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- writing
@contextmanager
def locked(directory: Path):
    """Exclusive flock on the run directory itself for a read-merge-write, so jobs writing one
    results.csv at the same time do not drop each other's rows (and leave no lock file)."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): jobs must not overlap
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def merge_csv(path: Path, new: pd.DataFrame, key: list[str], replace: pd.DataFrame | None = None,
              old: pd.DataFrame | None = None, order: list[str] | None = None) -> pd.DataFrame:
    """``new`` merged into the table at ``path`` (or ``old``): old rows whose ``key`` is among
    ``replace``'s (default ``new``'s) are dropped; sorted by ``order`` (default ``key``) and
    written atomically. Call under :func:`locked`."""
    if old is None and path.exists():
        old = read_table(path)
    if old is not None and len(old):
        gone = (new if replace is None else replace).set_index(key).index
        new = pd.concat([old[~old.set_index(key).index.isin(gone)], new], ignore_index=True)
    new = sort_rows(new, order or key)
    atomic_write_text(path, new.to_csv(index=False))
    return new


def write_results(run: RunDir, new: pd.DataFrame, positions: list[dict] | None = None,
                  token_nll: dict[str, np.ndarray] | None = None) -> pd.DataFrame:
    """Merge rows into the run's results.csv (new rows replace old ones of the same key), their
    binned positions (``positions``, default ``new.attrs["positions"]``) into positions.csv, replacing
    every bin of those keys, and their per-token NLL (``token_nll``, default ``new.attrs["token_nll"]``)
    into token_nll.npz. Files are replaced atomically, under one lock."""
    positions = new.attrs.pop("positions", None) if positions is None else positions
    token_nll = new.attrs.pop("token_nll", None) if token_nll is None else token_nll
    new = backfill(new)
    with locked(run.path):
        if token_nll:
            merge_token_nll(run.path / TOKEN_NLL, token_nll)
        if positions is not None:
            table = pd.DataFrame(positions, columns=POSITION_COLUMNS)
            merge_csv(run.path / "positions.csv", table.astype({"stride": int}), KEY, replace=new,
                      order=KEY + ["bin_start"])
        old = backfill(read_results(run.results)) if run.results.exists() else None
        new = merge_csv(run.results, new, KEY, old=old)
    return new
