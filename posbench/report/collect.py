"""Results rows from many run dirs, and the checks that they make one report: one config
and one run per seed in each line, one text (:mod:`posbench.report.build` explains each rule),
and what the runs' setups share or differ in (setup_header, run_setup)."""

from __future__ import annotations

import difflib
import math
from pathlib import Path

import pandas as pd

from ..config import BOS_SUFFIX
from ..errors import PosbenchError
from ..eval.probes import probe_files
from ..eval.results import (
    LINE,
    RESULTS,
    TASKS,
    backfill,
    by_columns,
    by_values,
    find_files,
    line_label,
    read_table,
    variant_of,
    with_labels,
)
from .figures import amount

GROUP = ["encoding", "variant", "rope_scaling", "mode", "stride", "model", "data", "train_len", "split", "eval_len"]


def collect(paths: list[str | Path], name: str = "results.csv", by: list[str] = ()) -> pd.DataFrame:
    """Every ``name`` (results.csv, positions.csv, passkey.csv, any probe's) under ``paths`` (run dirs or
    sweep dirs), concatenated, with each row's ``run`` dir, its value of each config key of ``by``
    as data (a ``by:KEY`` column, :func:`posbench.eval.results.by_values`) and its ``variant``, those
    values as a label shows them (:func:`posbench.eval.results.variant_of`), empty without ``by``.
    Empty for no positions/passkey files."""
    files = find_files(paths, name)
    if not files:
        if name != RESULTS:
            return pd.DataFrame()
        where = ", ".join(map(str, paths))
        if find_files(paths, TASKS):
            raise PosbenchError(f"report: no results.csv under {where}, only tasks.csv (algorithmic tasks, "
                                "read by posbench.report.tasks)")
        raise PosbenchError(f"report: neither results.csv nor tasks.csv under {where}; "
                            "pass run or sweep directories made by posbench train")
    values = _by_values(files, by, paths)
    frames = [read_table(f).assign(run=str(f.parent), variant=variant_of(v), **v) for f, v in zip(files, values)]
    df = pd.concat(frames, ignore_index=True)
    return backfill(df) if name == RESULTS else df


DIR_KEY = "dir"  # --by dir: a run's label names the path given that holds it (given_path)


def given_path(file: Path, paths: list[str | Path]) -> str:
    """The first of ``paths`` that ``file`` was found under (:func:`find_files`), as given; relative
    to the working directory where it is inside it, so an absolute path names no home dir."""
    f = file.resolve()
    for p in map(Path, paths):
        r = p.resolve()
        if f == r or r in f.parents or (r.is_file() and f.parent == r.parent):
            try:
                return str(r.relative_to(Path.cwd().resolve())) if p.is_absolute() else str(p)
            except ValueError:
                return str(p)
    return str(file.parent)


def _by_values(files: list[Path], by: list[str], paths: list[str | Path]) -> list[dict[str, str | None]]:
    """Each results file's run's values of the config keys ``by`` (:func:`posbench.eval.results.by_values`;
    none without ``by``), ``dir`` (:data:`DIR_KEY`) the one of ``paths`` it was found under
    (:func:`given_path`). A key some runs predate is None in theirs; a key no run has, or a config
    group instead of a key, is refused."""
    if not by:
        return [{} for _ in files]
    runs = [f.parent for f in files]
    given = [given_path(f, paths) if DIR_KEY in by else "" for f in files]
    keys = [k for k in by if k != DIR_KEY]
    configs = [_hashed_config(str(run)) if keys else {} for run in runs]
    missing = [run for run, c in zip(runs, configs) if c is None]
    if missing:
        raise PosbenchError(f"report: --by {','.join(by)} needs the config.yaml beside {missing[0] / RESULTS}, "
                            "which is missing")
    known = sorted(set().union(*configs))
    for key in keys:
        inside = [k for k in known if k.startswith(key + ".")]
        if inside:
            raise PosbenchError(f"report: --by {key!r} names a config group, not a key; valid: one of its keys, "
                                f"e.g. {', '.join(inside[:3])}")
        if key not in known:
            close = difflib.get_close_matches(key, known, n=3) or known[:3]
            raise PosbenchError(f"report: --by {key!r} is not a key of any run's config; valid: a dotted key such "
                                f"as {', '.join(close)}, or {DIR_KEY} (the dir given that holds each run)")
    return [by_values({**c, DIR_KEY: g}, by) for c, g in zip(configs, given)]


def check_one_run_per_seed(df: pd.DataFrame, also: tuple[str, ...] = (), who: str = "report",
                           remedy: str = f"pass each run once, or --by {DIR_KEY} to draw the runs under each path "
                                         "given as lines of their own") -> None:
    """Refuse to count a seed twice: two runs that give a line's cell the same seed (module docstring);
    ``also``: columns that tell cells apart besides a line's (``steps`` for the matched table); ``who``
    and ``remedy``: the message's prefix and its advice, for a caller with other options (a script)."""
    keys = [c for c in GROUP + list(also) + ["seed"] if c in df]
    if "run" not in df or "seed" not in df or df.empty:
        return
    runs = df.groupby(keys, dropna=False, sort=False).run.unique()
    twice = runs[runs.map(len) > 1]
    if twice.empty:
        return
    cell = dict(zip(keys, twice.index[0]))
    first, second = twice.iloc[0][:2]
    label = line_label(cell["encoding"], cell.get("rope_scaling", "none"), cell.get("mode", "nonoverlapping"),
                       cell.get("stride", ""), cell.get("variant", ""))
    raise PosbenchError(f"{who}: seed {cell['seed']} of {label} (train_len {cell.get('train_len')}, "
                        f"L={cell.get('eval_len')}) is in two runs, {first} and {second}: pooled, it would count "
                        f"as two seeds and narrow the interval; {remedy}")


def _hashed_config(run: str) -> dict | None:
    """The keys of a run's config.yaml that its config_hash covers, flattened ('train.lr')."""
    from omegaconf import OmegaConf

    from ..config import IMPLIED_WHEN_ABSENT, flat_items, hashed_part

    path = Path(run) / "config.yaml"
    if not path.is_file():
        return None
    found = dict(flat_items(hashed_part(OmegaConf.to_container(OmegaConf.load(path), resolve=False))))
    if any(k.startswith("model.") for k in found):  # a model section: its implied settings
        found = {**{k: v for k, v in IMPLIED_WHEN_ABSENT.items() if k.startswith("model.")}, **found}
    return found


# keys a user sets, before those a preset derives from them (train.decay_frac, warmup_steps, ...):
# the first named is the one --by is advised for
CHOSEN = ("train.steps", "train.train_len", "data.train_tokens", "model.name", "train.batch_size", "train.lr",
          "data.name")


def config_diff(runs: list[str], hashes: list[str]) -> str:
    """'train.lr (0.001 in runs/a, 0.002 in runs/b)': the hashed config keys where ``runs`` differ."""
    configs = [_hashed_config(r) for r in runs]
    if any(c is None for c in configs):
        where = ", ".join(f"{h} in {r}" for h, r in zip(hashes, runs))
        return f"config_hash ({where}; no config.yaml in the run dirs to compare)"
    unset = object()
    keys = sorted(set().union(*configs))
    differ = [k for k in keys if len({repr(c.get(k, unset)) for c in configs}) > 1]
    differ.sort(key=lambda k: (CHOSEN.index(k) if k in CHOSEN else len(CHOSEN)))  # what a user sets, first
    if not differ:
        return (f"config_hash ({', '.join(f'{h} in {r}' for h, r in zip(hashes, runs))}) "
                "though their config.yaml files agree")
    shown = [f"{k} (" + ", ".join(f"{c.get(k, 'unset')} in {r}" for c, r in zip(configs, runs)) + ")"
             for k in differ[:3]]
    more = f" and {len(differ) - 3} more key(s)" if len(differ) > 3 else ""
    return ", ".join(shown) + more


def check_one_config(df: pd.DataFrame, who: str = "report", remedy: str = "") -> None:
    """Refuse to average a line over runs whose configs differ in more than the seed; ``who`` and
    ``remedy``: the message's prefix and its advice where the report's (fewer dirs, or --by) do not
    apply (a script)."""
    if "config_hash" not in df or df.empty:
        return
    df = with_labels(df) if "label" not in df else df
    keys = [c for c in LINE + ["eval_len", "length", "mode", "stride"] if c in df]
    for _, g in df.groupby(keys, dropna=False, sort=False):
        if g.config_hash.nunique() > 1:
            first = g.dropna(subset=["config_hash"]).drop_duplicates("config_hash")
            diff = config_diff(first.run.tolist(), first.config_hash.tolist())
            remedy = remedy or (f"pass fewer dirs, so that each line's runs differ only in seed, or --by "
                                f"{diff.split(' ', 1)[0]} to draw each value as a line of its own")
            raise PosbenchError(f"{who}: cannot average {g.label.iloc[0]} runs whose configs differ in {diff}; "
                                f"{remedy}")


SCORED_TOKENS = "scored tokens"  # the rows' token count (eval.max_tokens caps it), named so in messages


SIZE_KEYS = ("model.d_model", "model.n_layers", "model.n_heads", "model.d_ff")  # a model's size, besides its name


def _text_config(run: str) -> dict | None:
    """What chose the tokens a run scored, from its config.yaml: the ``data.*`` keys (corpus, files,
    split fractions, document separator, the vocabulary and its tokenizer's settings; not
    data.cache_dir) and, for a pretrained model, its own tokenizer (``pretrained.name`` without the
    BOS policy's suffix: ``bos=every`` scores the same tokens as ``bos=first``). None without
    config.yaml."""
    from omegaconf import OmegaConf

    from ..config import flat_items

    path = Path(run) / "config.yaml"
    if not path.is_file():
        return None
    flat = dict(flat_items(OmegaConf.to_container(OmegaConf.load(path), resolve=False)))
    text = {k: v for k, v in flat.items() if k.startswith("data.") and k != "data.cache_dir"}
    if "pretrained.name" in flat:  # the model file names its tokenizer; a BOS policy scores the same tokens
        text["pretrained.name"] = str(flat["pretrained.name"]).removesuffix(BOS_SUFFIX["every"])
    return text


def _texts(df: pd.DataFrame) -> tuple[dict[str, dict], list[str], list[str]]:
    """-> (each run's text: field -> value, the fields in which the runs differ, one run per
    distinct text). A run's text: the config keys of :func:`_text_config` that every run's
    config.yaml has (the rows' ``data`` name for a run without one), the rows' ``split``
    (``eval.split``) and their scored-token count. Not compared: ``mode`` and ``stride``, which
    score the same tokens with other context and are part of every line's label
    (``alibi sliding/64``)."""
    if df.empty or "run" not in df:
        return {}, [], []
    def joined(g: pd.DataFrame, col: str) -> str:  # a run's values of a column: '2048', 'test/validation'
        return "/".join(sorted({str(int(v)) if col == "tokens" else str(v) for v in g[col].dropna()}))

    texts = {run: {**(_text_config(run) or {"data.name": joined(g, "data")}), "eval.split": joined(g, "split"),
                   SCORED_TOKENS: joined(g, "tokens")} for run, g in df.groupby("run", sort=False)}
    shared = set.intersection(*(set(t) for t in texts.values()))
    kinds: dict[str, str] = {}
    for run, text in texts.items():
        kinds.setdefault(repr(sorted((k, repr(v)) for k, v in text.items() if k in shared)), run)
    runs = list(kinds.values())
    order = [k for k in texts[runs[0]] if k in shared]  # data.* in config order, then split and tokens
    return texts, [k for k in order if len({repr(texts[r][k]) for r in runs}) > 1], runs


def text_diff(df: pd.DataFrame) -> str:
    """'' where every run of the results rows ``df`` scored the same text (:func:`_texts`), else what
    differs, as :func:`config_diff` words it, one run named per distinct text: 'data.vocab_size
    (1024 in runs/a, 8192 in runs/b), scored tokens (2048 in runs/a, 16384 in runs/b)'."""
    texts, differ, runs = _texts(df)
    shown = [f"{k} (" + ", ".join(f"{texts[r][k]} in {r}" for r in runs) + ")" for k in differ[:3]]
    return ", ".join(shown) + (f" and {len(differ) - 3} more field(s)" if len(differ) > 3 else "")


def mixed_data(df: pd.DataFrame) -> pd.Series:
    """Each row's ``data`` with the fields in which the runs' texts differ (:func:`_texts`):
    'sotu [vocab_size=1024, tokens=2048]', so that a report asked to mix texts (``--mix``) keeps
    each text's lines apart (a ``data`` column, a ``(data=...)`` suffix) and compares, bolds and
    pairs only lines of one text. The rows' ``data`` as they are where the texts agree."""
    texts, differ, _ = _texts(df)
    if not differ:
        return df.data
    short = {k: "tokens" if k == SCORED_TOKENS else k.rsplit(".", 1)[-1] for k in differ}
    named = {run: ", ".join(f"{short[k]}={text[k]}" for k in differ) for run, text in texts.items()}
    return df.data.astype(str) + " [" + df.run.map(named) + "]"


def texts_apart(df: pd.DataFrame, mix: bool = False) -> tuple[pd.DataFrame, str]:
    """:func:`check_one_text`, and where ``mix`` lets texts differ, each text's lines apart (a
    ``data`` column, :func:`mixed_data`), compared and paired within their text only, as the report
    and the tests that re-derive its verdicts read them, the corpus's own name kept beside it
    (``data_name``, what the verdicts name a setup by). -> (the rows, what differs: '' where nothing
    does)."""
    check_token_sets(df)
    mixed = check_one_text(df, mix)
    return (df.assign(data=mixed_data(df), data_name=df.data) if mixed else df), mixed


def check_token_sets(df: pd.DataFrame) -> None:
    """Refuse a line of one run whose rows score other tokens at other lengths (written before a
    run held one token set per split and mode, :mod:`posbench.eval.token_set`): its ratios to
    train_len and their paired intervals would compare other text, with or without ``--mix``."""
    if df.empty or "run" not in df:
        return
    for (run, label, split), g in with_labels(df).groupby(["run", "label", "split"], sort=False):
        sets = g.dropna(subset=["tokens"]).groupby("tokens").eval_len.apply(sorted)
        if len(sets) > 1:
            shown = "; ".join(f"{int(n):,} at {', '.join(map(str, ls))}" for n, ls in sets.sort_index(ascending=False)
                              .items())
            lengths = ",".join(map(str, sorted(g.eval_len.unique())))
            raise PosbenchError(f"report: line {label!r} of {run} scores other tokens at other lengths ({shown} "
                                f"{split} tokens), so its curve compares other text; evaluate it again on one set: "
                                f"posbench eval checkpoint={run} eval.recompute=true 'eval.lengths=[{lengths}]'")


def check_one_text(df: pd.DataFrame, mix: bool = False) -> str:
    """Refuse to put runs scored on different text (:func:`text_diff`) in one report: other tokens,
    or another vocabulary, give other perplexities, and one table would rank them side by side.
    With ``mix``: what differs ('' where nothing does), for the report's header."""
    diff = text_diff(df)
    if diff and not mix:
        raise PosbenchError(f"report: these runs were scored on different text, so their perplexities do not compare: "
                            f"{diff}; report them apart, or pass --mix to put them in one report anyway "
                            "(its header then says what differs)")
    return diff


def _values(found) -> str:
    """'32/64', '30/250/1,000', '0.13M..5.25M': the distinct values of a setup column, more than three as min..max."""
    found = [v for v in found if not pd.isna(v)]
    shown = list(dict.fromkeys(map(str, found)))
    return f"{min(found)}..{max(found)}" if len(shown) > 3 and all(isinstance(v, (int, float)) for v in found) \
        else "/".join(shown)


def setup_header(df: pd.DataFrame, setup: pd.DataFrame, mixed: str = "") -> str:
    """report.md's header: how the runs' setups differ where a report keeps them together on
    purpose (a size axis, an extension or budget study): the model (its name and size keys),
    train_len, steps, batch size and training tokens; and ``mixed``, the :func:`text_diff` of a
    report asked to mix texts (``--mix``). '' where the runs share all of these."""
    runs = setup.set_index("run") if "run" in setup else setup
    sizes = {run: _hashed_config(run) or {} for run in runs.index} if "run" in setup else {}
    columns = [("model", runs.get("model", pd.Series(dtype=object)).tolist()),
               *((key, [sizes[run].get(key) for run in runs.index]) for key in SIZE_KEYS if sizes),
               ("train_len", runs.get("train_len", pd.Series(dtype=object)).tolist()),
               ("train.steps", runs.get("steps", pd.Series(dtype=object)).tolist()),
               ("train.batch_size", runs.get("batch_size", pd.Series(dtype=object)).tolist()),
               ("training tokens", [amount(v) for v in runs.get("train_tokens", pd.Series(dtype=float))])]
    differ = [f"{name} ({_values(v if name != 'train.batch_size' else [int(x) for x in v if not pd.isna(x)])})"
              for name, v in columns if len({str(x) for x in v if not pd.isna(x)} - {"?"}) > 1]
    parts = []
    if differ:
        parts.append(f"The runs differ in {', '.join(differ)}: each line keeps its own setup (the table's columns "
                     "and the figures' line names say which), so compare a line's ratio with the lines of its setup. "
                     "The table's bold, the range at train_len and its warning below compare every line, across "
                     "setups: there a difference is the setup's as much as the encoding's.")
    if mixed:
        parts.append(f"**Scored on different text** (--mix): {mixed}. Perplexities compare only between lines "
                     "scored on the same text; across that difference the table's bold and intervals pair nothing.")
    return "\n\n".join(parts)


def _extra_tables(paths, df: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, tuple[pd.DataFrame, type | None]]]:
    """positions.csv rows, and each probe's rows (``<probe>.csv``, with its class where it can
    be imported here), under ``paths``, labelled, with each run's model, data and variant from
    its results rows (no config.yaml read again); empty where no run has them."""
    runs = df.groupby("run")[["model", "data", "variant", *by_columns(df)]].first()

    def labelled(t: pd.DataFrame) -> pd.DataFrame:
        if not t.empty:  # the run's variant (--by) replaces collect's empty one
            t = t.drop(columns="variant")
            t = with_labels(t.join(runs[[c for c in runs if c not in t]], on="run"))
            check_one_config(t)
        return t

    probes: dict[str, type | None] = {}
    for run in runs.index:
        for name, cls in probe_files(run).items():
            probes[name] = probes.get(name) or cls
    found = {name: (labelled(collect(paths, f"{name}.csv")), cls) for name, cls in sorted(probes.items())}
    return labelled(collect(paths, "positions.csv")), {k: v for k, v in found.items() if not v[0].empty}


def failed_runs(paths: list[str | Path]) -> list[tuple[str, str]]:
    """(job dir, error) for every sweep job under ``paths`` that failed: posbench writes a
    ``FAILED`` file (the error on its first line) in the job dir instead of results."""
    files = [f for p in map(Path, paths) if p.is_dir() for f in sorted(p.rglob("FAILED"))]
    return [(str(f.parent), (f.read_text(errors="replace").splitlines() or ["(no message)"])[0]) for f in files]


def run_setup(df: pd.DataFrame) -> pd.DataFrame:
    """One row per run of the results rows ``df``: its model, params, data, steps, train_len,
    ``batch_size`` (train.batch_size of its config.yaml; NaN without one) and ``train_tokens``
    (steps x batch_size x train_len windows' tokens)."""
    cols = [c for c in ("model", "params", "data", "steps", "train_len") if c in df]
    if "run" not in df:
        return df[cols].drop_duplicates().assign(batch_size=math.nan, train_tokens=math.nan)
    runs = df.groupby("run", sort=False)[cols].first()
    batch = [(_hashed_config(run) or {}).get("train.batch_size", math.nan) for run in runs.index]
    runs = runs.assign(batch_size=pd.to_numeric(pd.Series(batch, index=runs.index), errors="coerce"))
    steps = runs.steps if "steps" in runs else math.nan
    return runs.assign(train_tokens=steps * runs.batch_size * runs.train_len).reset_index()


def read_metrics(run: str | Path) -> pd.DataFrame:
    """A run's metrics.jsonl (step, loss, lr, ...), a torn or blank line left out; empty without one."""
    import json

    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        return pd.DataFrame()
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "step" in record and "loss" in record:
            records.append(record)
    return pd.DataFrame(records)
