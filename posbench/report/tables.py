"""Many run dirs -> one tidy table (mean, spread and 95% interval) -> Markdown/LaTeX, CSV, figures.

    posbench report multirun/2026-11-22_10-00-00            # report.md/.csv/.png/.svg in that dir
    posbench report outputs/zoo_quick --out results/zoo_quick --format latex --log-y

Each table line and each figure line is one *label*: the encoding, ``+<scaling>`` when it was
evaluated under a RoPE scaling (``rope+yarn``), and `` sliding/<stride>`` when it was scored
with sliding windows (``eval.mode=sliding``): ``alibi sliding/64`` for a stride of 64 tokens at
every length (``eval.stride=64``), ``alibi sliding/L/2`` for half the window at every length
(``eval.stride=null``, the default). Non-overlapping windows (the default protocol) add
nothing. A different stride is a different protocol, so it is a different line.

Seeds are averaged, nothing else: when one line would mix runs whose configs differ in more
than the seed (their rows carry different ``config_hash`` values), the report stops and names
the differing config keys, read from each run's ``config.yaml``. Runs that differ on purpose (an
ablation, a budget study) are told apart with ``--by KEY``: each run's value of the dotted config
key joins its label, ``t5 [bias_scale=none]`` for ``--by encoding.bias_scale``, so each value is
a line of its own. ``--by dir`` does the same by where a run was found: the label names the path
given (a run, sweep or results dir) that holds it, so the same configs trained twice (on two
devices, by two code versions) are two lines the verdicts compare.

A seed is counted once: a line whose seed appears in two runs (the same config exported to two
folders, or retrained and reported beside the shipped copy) would pool the two as two seeds and
narrow its interval, so the report stops and names both runs (:func:`check_one_run_per_seed`).

One report, one text: runs scored on different text (another corpus, split, vocabulary or
tokenizer, or another count of scored tokens) get other perplexities for that reason alone, so
the report stops and names the field that differs (:func:`check_one_text`), unless asked to mix
them (``mix``, ``--mix``: each text's lines are then kept and compared apart). Runs that differ in
model size, train_len or budget on the same text stay together (a size axis, an extension
study), and report.md's header says how they differ (:func:`setup_header`).

results.csv files written before a column existed read with its neutral value
(:func:`posbench.eval.results.backfill`). The figures are drawn by :mod:`posbench.report.figures`.

Every cell, every ratio ppl(L) / ppl(train_len) and every comparison between lines gets a 95%
interval covering the seeds' spread and the text's (:mod:`posbench.intervals`: the seeds'
variance plus that of a paired block bootstrap over the scored tokens, read from each run's
``token_nll.npz``), centred on the geometric mean over seeds, and a verdict
is printed only where the interval supports it: bold marks the lowest perplexity of a column
and every line not distinguishable from it; "within 10%" counts a length only when the whole
interval of its ratio is; a length whose interval straddles the bound is "not distinguishable".
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from ..config import BOS_SUFFIX, shipped_dir
from ..errors import PosbenchError
from ..eval.probes import probe_files
from ..eval.results import (
    LINE,
    RESULTS,
    TASKS,
    backfill,
    find_files,
    line_label,
    line_names,
    locked,
    read_results,
    read_table,
    report_dir,
    sort_rows,
    variant_text,
    with_labels,
)
from ..eval.token_nll import row_key
from ..intervals import Cell, Estimator, pool_seeds
from ..runs.rundir import RunDir, atomic_write_text
from .baselines import run_blocks
from .context import context_figure, context_gain, context_markdown
from .figures import (
    MIN_BIN_TOKENS,
    MIN_BIN_WINDOWS,
    REFERENCE_MIN_TOKENS,
    REFERENCE_MIN_TRAIN_LEN,
    Palette,
    _caption,
    amount,
    budget_short,
    missing_positions,
    positions_figure,
    positions_windows,
    ppl_figure,
    probe_figure,
    reference_lines,
    run_figure,
    save,
    seed_counts,
    setup_caption,
    training_figure,
)
from .html import write_html
from .learned_bias import trained_encoding, write_report_figure, write_run_figure
from .longppl import SAME_RTOL, longppl_part
from .per import per_figures
from .probes import THRESHOLD, effective_length_lines, probe_markdown, probe_summary
from .ranked import ZOOM_RATIO, choose_lines
from .tasks import TaskReport, read_tasks, write_task_report
from .verdicts import UNTRAINED, numeric_first, per_split, verdict_lines, verdicts_markdown

GROUP = ["encoding", "variant", "rope_scaling", "mode", "stride", "model", "data", "train_len", "split", "eval_len"]
NEAR = 1.10  # "holds up": ppl at most 10% above its value at train_len
# summarize(cells=True) only: Cell objects, SeedPools, and whether a line's runs were trained (steps > 0; a
# pretrained model's rows have 0), which the verdicts read to say where a trained line has one seed
CELL_COLUMNS = ("cell", "cell_pool", "ratio_pool", "trained")
COMPARED = ["train_len", "eval_len", "data", "split"]  # the lines one bold / vs_best comparison ranks
PARAMS_HEAD = {"params": "params (position)"}  # table header of the parameter-count column
TABLE_NOTE = ("geometric mean ± std over seeds [95% interval covering the seeds' spread and the text's (a "
              "block bootstrap over the scored tokens), centred on the geometric mean; a line of one seed: the "
              "text's only]; bold: the lowest ppl of a column and every line whose 95% "
              "interval of the ratio to it contains 1 (none where a comparison has no interval); '(1 seed)': a "
              "cell averaged over a different number of seeds than the rest of its line (the seeds column)")
REFERENCE = (shipped_dir("reference") or Path("results/reference")) / "alibi_paper_L512.csv"  # wheel or checkout
# What the packaged reference's rows leave out, for its panel's title: the paper's WikiText-103 model
# (Press et al. 2022, sec. 4; conf/model/alibi_paper.yaml), 247M parameters, 286k updates of 73,728
# tokens (conf/experiment/alibi_paper.yaml). A --reference CSV may carry these columns itself.
REFERENCE_SETUP = {"data": "WikiText-103", "params": 247_000_000, "train_tokens": 286_000 * 73_728}


# ---------------------------------------------------------------- reading
def collect(paths: list[str | Path], name: str = "results.csv", by: list[str] = ()) -> pd.DataFrame:
    """Every ``name`` (results.csv, positions.csv, passkey.csv, any probe's) under ``paths`` (run dirs or
    sweep dirs), concatenated, with each row's ``run`` dir and its ``variant``: the values of the
    config keys ``by`` (:func:`posbench.eval.results.variant_text`), empty without ``by``. Empty for no
    positions/passkey files."""
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
    variants = _variants(files, by, paths)
    frames = [read_table(f).assign(run=str(f.parent), variant=v) for f, v in zip(files, variants)]
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


def _variants(files: list[Path], by: list[str], paths: list[str | Path]) -> list[str]:
    """Each results file's run's values of the config keys ``by`` ('' without ``by``), ``dir``
    (:data:`DIR_KEY`) the one of ``paths`` it was found under (:func:`given_path`). A key some runs
    predate is left out of theirs; a key no run has, or a config group instead of a key, is refused."""
    if not by:
        return [""] * len(files)
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
    return [variant_text({**c, DIR_KEY: g}, by) for c, g in zip(configs, given)]


def check_one_run_per_seed(df: pd.DataFrame, also: tuple[str, ...] = ()) -> None:
    """Refuse to count a seed twice: two runs that give a line's cell the same seed (module docstring);
    ``also``: columns that tell cells apart besides a line's (``steps`` for the matched table)."""
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
    raise PosbenchError(f"report: seed {cell['seed']} of {label} (train_len {cell.get('train_len')}, "
                        f"L={cell.get('eval_len')}) is in two runs, {first} and {second}: pooled, it would count "
                        f"as two seeds and narrow the interval; pass each run once, or --by {DIR_KEY} to draw the "
                        "runs under each path given as lines of their own")


# ---------------------------------------------------------------- one config per line
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
        return f"config_hash ({where}; no config.yaml beside results.csv to compare)"
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


def check_one_config(df: pd.DataFrame) -> None:
    """Refuse to average a line over runs whose configs differ in more than the seed."""
    if "config_hash" not in df or df.empty:
        return
    df = with_labels(df) if "label" not in df else df
    keys = [c for c in LINE + ["eval_len", "length", "mode", "stride"] if c in df]
    for _, g in df.groupby(keys, dropna=False, sort=False):
        if g.config_hash.nunique() > 1:
            first = g.dropna(subset=["config_hash"]).drop_duplicates("config_hash")
            diff = config_diff(first.run.tolist(), first.config_hash.tolist())
            raise PosbenchError(f"report: cannot average {g.label.iloc[0]} runs whose configs differ in {diff}; "
                                f"pass fewer dirs, so that each line's runs differ only in seed, or --by "
                                f"{diff.split(' ', 1)[0]} to draw each value as a line of its own")


# ---------------------------------------------------------------- one text per report
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
    and the tests that re-derive its verdicts read them. -> (the rows, what differs: '' where
    nothing does)."""
    check_token_sets(df)
    mixed = check_one_text(df, mix)
    return (df.assign(data=mixed_data(df)) if mixed else df), mixed


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


# ---------------------------------------------------------------- summary
def summarize(df: pd.DataFrame, estimator: Estimator | None = None, cells: bool = False,
              per: list[str] = ()) -> pd.DataFrame:
    """Geometric mean (``ppl_mean``: exp of the mean log ppl, the centre of its interval), std, min,
    max of ppl over seeds (and the mean nll, bpb, word_ppl), one row per
    (encoding, rope_scaling, mode, stride, ..., eval_len), with the line's ``label``, its
    parameter counts ``params`` and ``pos_params`` (NaN where the rows predate them) and the
    interval columns of :func:`add_intervals` (bootstrap intervals where rows carry their ``run``
    dir and it holds token_nll.npz); ``cells``: keep each row's :class:`Cell` in a ``cell`` column
    and its column's pooled seed variances in ``cell_pool`` and ``ratio_pool`` (:func:`add_intervals`;
    what :mod:`posbench.report.verdicts` compares); ``per``: ``--per`` keys, whose values split the
    columns that compare lines (:func:`add_intervals`)."""
    df = with_labels(backfill(df))
    ok = df.assign(**{c: df[c].where(df.status == "ok") for c in ("ppl", "nll", "bpb", "word_ppl")})
    stats = ok.assign(log_ppl=np.log(ok.ppl)).groupby(GROUP, dropna=False).agg(
        gmean=("log_ppl", "mean"), std=("ppl", "std"), min=("ppl", "min"), max=("ppl", "max"), count=("ppl", "count"))
    stats["gmean"] = np.exp(stats.gmean)
    stats.columns = ["ppl_mean", "ppl_std", "ppl_min", "ppl_max", "n_ok"]
    means = ok.groupby(GROUP, dropna=False)[["nll", "bpb", "word_ppl"]].mean().add_suffix("_mean")
    seeds = df.groupby(GROUP, dropna=False).seed.nunique().rename("seeds")
    counts = df.groupby(GROUP, dropna=False)[["params", "pos_params"]].max()  # one config per line: one count
    steps = pd.to_numeric(df["steps"], errors="coerce") if "steps" in df else pd.Series(0.0, index=df.index)
    trained = df.assign(trained=steps.fillna(0).gt(0)).groupby(GROUP, dropna=False).trained.any()
    out = with_labels(pd.concat([stats, seeds, means, counts, trained], axis=1).reset_index())
    out = add_intervals(out.assign(cell=_cells(df)), estimator or Estimator(), per)
    out = out if cells else out.drop(columns=list(CELL_COLUMNS))
    return sort_rows(out[["label"] + [c for c in out if c != "label"]], GROUP)


# ---------------------------------------------------------------- intervals
def per_values(summary: pd.DataFrame, per: list[str]) -> list[tuple[str, ...]]:
    """Each row's value of each ``--per`` key (``train.steps`` -> the ``steps=`` of its label; 'unset'
    where the label has none)."""
    values = [per_split(summary.label, key)[1].fillna("unset") for key in per]
    return list(zip(*values)) if values else [() for _ in range(len(summary))]


def compared_keys(summary: pd.DataFrame, per: list[str] = ()) -> list[tuple[str, ...]]:
    """Each row's column: the lines it is ranked and pooled with (:func:`add_intervals`)."""
    base = [tuple(r) for r in summary[COMPARED].astype(str).itertuples(index=False)]
    return [b + v for b, v in zip(base, per_values(summary, per))] if per else base


def _cells(df: pd.DataFrame) -> list[Cell]:
    """One :class:`Cell` per GROUP key, in groupby order: the ok seeds' mean NLLs and, where every
    one of them has its block sums (from its run's token_nll.npz, or a shipped run's blocks.npz:
    :func:`posbench.report.baselines.run_blocks`), those."""
    stored: dict[str, dict] = {}

    def blocks(row) -> tuple[np.ndarray, np.ndarray] | None:
        run = row.get("run")
        if not isinstance(run, str):
            return None
        if run not in stored:
            stored[run] = run_blocks(Path(run))
        found = stored[run].get(row_key(row))
        return found if found is not None and int(found[1].sum()) == row["tokens"] else None

    cells = []
    for _, g in df.groupby(GROUP, dropna=False):
        g = g[(g.status == "ok") & g.nll.notna()].sort_values("seed")
        cell = Cell(g.seed.to_numpy(), g.nll.to_numpy(dtype=float))
        sums = [blocks(row) for row in g.to_dict("records")]
        if sums and all(s is not None for s in sums):
            cell.blocks, cell.sizes = np.stack([b for b, _ in sums]), sums[0][1]
            cell.tokens_id = (str(g.data.iloc[0]), str(g.split.iloc[0]), int(g.tokens.iloc[0]))
        cells.append(cell)
    return cells


def add_intervals(summary: pd.DataFrame, estimator: Estimator, per: list[str] = ()) -> pd.DataFrame:
    """Interval columns from the summary's ``cell`` column (see docs/report.md):

    - ``ppl_ci_low``, ``ppl_ci_high``, ``ci_method``: exp of the 95% interval of the mean NLL;
      ``block_tokens``: the length of the cell's bootstrap blocks (NA: no per-token NLL);
    - ``ratio_mean`` (the geometric mean over seeds of each seed's ppl(L) / ppl(train_len), the
      centre of its interval), ``ratio_std`` (their std),
      ``ratio_ci_low``, ``ratio_ci_high``, ``ratio_method``: the line's ratio to its train_len cell,
      paired (by seed, or by resampled blocks);
    - ``vs_best``, ``vs_best_ci_low``, ``vs_best_ci_high``: exp(mean NLL - the lowest mean NLL among
      the lines of the same train_len and eval_len) and its interval; ``tied_best``: True where that
      interval contains 1 (and for the lowest itself, and a line whose mean NLL is the lowest's to
      :data:`~posbench.report.longppl.SAME_RTOL`: the same computation made again at another commit,
      whose paired interval is as narrow as their last bits' difference), False where it lies
      above 1, NA without one.

    A line of fewer than 3 seeds takes at least the seeds' variance pooled over its column's lines
    (:func:`posbench.intervals.seed_term`): of their mean NLLs for its cells, of their per-seed
    log ratios for its ratios; those pools are the ``cell_pool`` and ``ratio_pool`` columns.

    A column is the lines of one train_len, eval_len, text and split, and, with ``per`` (``--per``
    keys), of one value of each: a budget study's lines are ranked and pooled within their budget,
    not against another budget's."""
    column = compared_keys(summary, per)
    cell_pool = {key: pool_seeds(c.nll for c, k in zip(summary.cell, column) if k == key) for key in set(column)}
    cell_ci = [estimator.cell(c, cell_pool[k]) for c, k in zip(summary.cell, column)]
    out = summary.assign(ppl_ci_low=[math.exp(i.low) for i in cell_ci],
                         ppl_ci_high=[math.exp(i.high) for i in cell_ci], ci_method=[i.method for i in cell_ci],
                         block_tokens=pd.array([None if c.sizes is None else int(c.sizes.max()) for c in summary.cell],
                                               dtype="Int64"))
    ratio = {c: [math.nan] * len(out) for c in ("ratio_mean", "ratio_std", "ratio_ci_low", "ratio_ci_high",
                                                 "vs_best", "vs_best_ci_low", "vs_best_ci_high")}
    ratio["ratio_method"] = ["none"] * len(out)
    tied = [pd.NA] * len(out)
    at = {i: pos for pos, i in enumerate(out.index)}
    paired = {}  # row -> (its cell, its line's train_len cell, per-seed log ratios)
    for _, g in out.groupby(LINE, dropna=False):
        base = g[g.eval_len == g.train_len].cell
        if base.empty or not base.iloc[0].nll.size:
            continue
        base = base.iloc[0]
        for i, cell in g.cell.items():
            _, ia, ib = np.intersect1d(cell.seeds, base.seeds, return_indices=True)
            paired[at[i]] = (cell, base, cell.nll[ia] - base.nll[ib])
    ratio_pool = {key: pool_seeds(d for row, (_, _, d) in paired.items() if column[row] == key) for key in set(column)}
    for row, (cell, base, log_ratios) in paired.items():
        per_seed = np.exp(log_ratios)
        d = estimator.difference(cell, base, same_models=True, pools=(ratio_pool[column[row]], None))
        ratio["ratio_mean"][row] = math.exp(d.estimate) if per_seed.size else math.nan  # the geometric mean
        ratio["ratio_std"][row] = float(per_seed.std(ddof=1)) if per_seed.size > 1 else math.nan
        ratio["ratio_ci_low"][row], ratio["ratio_ci_high"][row] = math.exp(d.low), math.exp(d.high)
        ratio["ratio_method"][row] = d.method
    for _, g in out.groupby(pd.Series(column, index=out.index).map(str), sort=False):  # one column's lines
        means = g.cell.map(lambda c: c.mean).dropna()
        if means.empty:
            continue
        best = g.cell[means.idxmin()]
        for i, cell in g.cell.items():
            if not cell.nll.size:
                continue
            row = at[i]
            pool = cell_pool[column[row]]
            d = estimator.difference(cell, best, pools=(pool, pool)) if i != means.idxmin() else None
            low, high = (0.0, 0.0) if d is None else (d.low, d.high)
            ratio["vs_best"][row] = math.exp(cell.mean - best.mean)
            ratio["vs_best_ci_low"][row], ratio["vs_best_ci_high"][row] = math.exp(low), math.exp(high)
            same = math.isclose(cell.mean, best.mean, rel_tol=SAME_RTOL)
            tied[row] = True if same else pd.NA if math.isnan(low) else bool(low <= 0)
    return out.assign(**ratio, tied_best=pd.array(tied, dtype="boolean"), cell_pool=[cell_pool[k] for k in column],
                      ratio_pool=[ratio_pool[k] for k in column])


def _fmt(mean: float, std: float, pm: str = " ± ", low: float = math.nan, high: float = math.nan) -> str:
    """'11.00 ± 1.41 [10.12, 11.95]': mean, std over seeds (none for one seed), 95% interval (where known)."""
    if mean is None or math.isnan(mean):
        return "n/a"
    text = f"{mean:.2f}" if std is None or math.isnan(std) else f"{mean:.2f}{pm}{std:.2f}"
    return text if math.isnan(low) or math.isnan(high) else f"{text} {interval_text(low, high)}"


def interval_text(low: float, high: float, digits: int = 2) -> str:
    return "[no interval]" if math.isnan(low) or math.isnan(high) else f"[{low:.{digits}f}, {high:.{digits}f}]"


def _bold(summary: pd.DataFrame) -> pd.Series:
    """Which cells are bold: per (train_len, eval_len) column, the lines tied with the lowest
    (``tied_best``), or none where a comparison there has no interval."""
    if "tied_best" not in summary:
        return pd.Series(False, index=summary.index)
    tied = summary.tied_best.astype("boolean")
    known = tied.notna() | summary.ppl_mean.isna()
    decided = known.groupby([summary[c] for c in COMPARED if c in summary], dropna=False).transform("all")
    return (tied.fillna(False) & decided).astype(bool)


def count_text(n) -> str:
    """A parameter count for a table cell: exact below 10,000 ('330'), else in millions ('5.25M')."""
    if n is None or pd.isna(n):
        return "n/a"
    return f"{int(n):,}" if n < 10_000 else f"{n / 1e6:.2f}M"


def params_text(params, pos_params) -> str:
    """'5.52M (0.26M)': all parameters, and in brackets the position encoding's."""
    return f"{count_text(params)} ({count_text(pos_params)})"


def _table_cells(summary: pd.DataFrame):
    """-> lengths, extra line columns, and per line: (keys, seeds, {eval_len: (cell args, bold?,
    seeds note)}). ``seeds`` is the line's usual seed count; a cell averaged over another count gets
    the note ' (1 seed)' (:func:`posbench.report.figures.seed_counts`). Lines get a ``params``
    extra column ('5.52M (0.26M)') when any row has parameter counts."""
    summary = with_labels(summary)
    lengths = sorted(summary.eval_len.unique())
    extra = [c for c in ("model", "data", "split") if c in summary and summary[c].nunique() > 1]
    if "params" in summary and summary.params.notna().any():
        summary = summary.assign(params=[params_text(a, b) for a, b in zip(summary.params, summary.pos_params)])
        extra = ["params"] + extra
    counts, usual = seed_counts(summary)
    summary = summary.assign(bold=_bold(summary), cell_seeds=counts, line_seeds=usual)
    several = len(summary.groupby(["label", "train_len"] + extra)) > 1  # one line: nothing to compare
    lines = []
    for keys, g in summary.groupby(["label", "train_len"] + extra, sort=False):
        cells = {r.eval_len: ((r.ppl_mean, r.ppl_std, getattr(r, "ppl_ci_low", math.nan),
                               getattr(r, "ppl_ci_high", math.nan)),
                              several and r.bold, _seeds_note(r.cell_seeds, r.line_seeds))
                 for r in g.itertuples()}
        lines.append((keys, int(g.line_seeds.max()), cells))
    return lengths, extra, lines


def _seeds_note(count, usual) -> str:
    """' (1 seed)' after a cell averaged over another number of seeds than its line's usual one."""
    if pd.isna(count) or count == usual:
        return ""
    return f" ({int(count)} seed{'' if count == 1 else 's'})"


def markdown_table(summary: pd.DataFrame) -> str:
    """Labels as rows, eval lengths as columns, 'mean ± std [95% interval]' cells; in bold the
    lowest ppl of each column and the lines not distinguishable from it; '(1 seed)' after a cell
    averaged over another number of seeds than the line's ``seeds`` (:data:`TABLE_NOTE`)."""
    lengths, extra, lines = _table_cells(summary)
    head = ["encoding", "train_len", "seeds", *(PARAMS_HEAD.get(c, c) for c in extra), *(f"L={n}" for n in lengths)]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (label, tlen, *rest), seeds, cells in lines:
        row = [label, str(tlen), str(seeds), *map(str, rest)]
        for n in lengths:
            (mean, std, low, high), best, note = cells.get(n, ((None, None, math.nan, math.nan), False, ""))
            text = "" if n not in cells else _fmt(mean, std, " ± ", low, high)
            row.append((f"**{text}**" if best else text) + note)
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out)


def latex_escape(text: str) -> str:
    """Text safe inside a LaTeX table cell ('kerple_log' -> 'kerple\\_log')."""
    special = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
               "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
    return "".join(special.get(ch, ch) for ch in str(text))


def latex_table(summary: pd.DataFrame) -> str:
    """A booktabs table (needs ``\\usepackage{booktabs}``): the Markdown table's cells and bold
    (\\textbf)."""
    lengths, extra, lines = _table_cells(summary)
    head = ["encoding", "$L_\\mathrm{train}$", "seeds", *(PARAMS_HEAD.get(c, c) for c in extra),
            *(f"$L={n}$" for n in lengths)]
    out = [r"\begin{table}[t]", r"\centering", r"\begin{tabular}{l" + "r" * (len(head) - 1) + "}",
           r"\toprule", " & ".join(head) + r" \\", r"\midrule"]
    for (label, tlen, *rest), seeds, cells in lines:
        row = [latex_escape(label), str(tlen), str(seeds), *map(latex_escape, rest)]
        for n in lengths:
            (mean, std, low, high), best, note = cells.get(n, ((None, None, math.nan, math.nan), False, ""))
            text = "" if n not in cells else _fmt(mean, std, r" $\pm$ ", low, high)
            row.append((rf"\textbf{{{text}}}" if best else text) + note)
        out.append(" & ".join(row) + r" \\")
    out += [r"\bottomrule", r"\end{tabular}",
            r"\caption{Perplexity at evaluation length $L$: " + latex_escape(TABLE_NOTE).replace("±", r"$\pm$")
            .replace(">=", r"$\geq$") + ".}",
            r"\label{tab:posbench}", r"\end{table}"]
    return "\n".join(out)


def _apart_why(at_train: pd.DataFrame, apart: pd.DataFrame, best: str) -> str:
    """What lines apart at train_len mean for their ratios: lines of one trained configuration
    that differ only in an inference-time method (``rope_scaling``: a scaling or a training-free
    extension, on a pretrained model or a trained run) are one model, which the method changes
    inside its context; other lines are models at different stages of training."""
    same = [c for c in ("encoding", "variant", "model", "data", "mode", "stride") if c in at_train]
    group = pd.concat([apart, at_train[at_train.name == best]])
    if "rope_scaling" in group and len(group[same].astype(str).drop_duplicates()) == 1:
        return ("one model under different inference-time methods, which change it inside its context: "
                "each ratio ppl(L) / ppl(train_len) is to its own line's ppl at train_len")
    return "the ratios ppl(L) / ppl(train_len) compare models at different stages of training"


def untrained_lines(df: pd.DataFrame) -> dict[tuple, tuple[float, float]]:
    """The lines (by :data:`LINE`) of results rows ``df`` whose ppl at train_len (geometric mean over
    seeds) is at least :data:`UNTRAINED` x their unigram perplexity -> (that ppl, the unigram's).
    Rows without ``unigram_ppl`` (written before it) decide nothing."""
    rows = with_labels(backfill(df))
    at = rows[(rows.eval_len == rows.train_len) & (rows.status == "ok") & rows.unigram_ppl.notna() & rows.ppl.notna()]
    found = {}
    for key, g in at.groupby(LINE, dropna=False, sort=False):
        ppl, unigram = float(np.exp(np.log(g.ppl).mean())), float(g.unigram_ppl.mean())
        if ppl >= UNTRAINED * unigram:
            found[key] = (ppl, unigram)
    return found


def untrained_text(ppl: float, unigram: float) -> str:
    return (f"no extrapolation verdict: its ppl at train_len, {ppl:.2f}, is {100 * ppl / unigram:.0f}% of the unigram "
            f"perplexity of its text ({unigram:.2f}, token frequencies alone; a verdict needs below "
            f"{100 * UNTRAINED:.0f}%): the model learned too little for its ratios to show how it extrapolates")


def extrapolation_summary(summary: pd.DataFrame, per: list[str] = (),
                          untrained: dict[tuple, tuple[float, float]] | None = None) -> list[str]:
    """How far apart the lines are at train_len (the highest over the lowest, a ratio with its
    paired 95% interval, :func:`interval_text`) and a warning when some differ beyond their intervals; for each line
    ppl(longest) / ppl(train_len) with its interval, and the longest length up to which every
    evaluated length is within 10% of its ppl at train_len: a length counts only when the whole
    interval of its ratio is at most 1.10, and one whose interval straddles 1.10 ends the range
    as "not distinguishable". With ``per`` (``--per`` keys), the spread and the warning are of each
    value's lines (a budget study's, per budget). ``untrained``: :func:`untrained_lines`, which get
    :func:`untrained_text` instead of a verdict."""
    untrained = untrained or {}
    summary = with_labels(summary).assign(name=lambda s: line_names(s))
    lines = []
    texts = [c for c in ("data", "split") if c in summary and summary[c].nunique() > 1]  # --mix: one text at a time
    keys_of = [k.rsplit(".", 1)[-1] for k in per]  # each key's value a column, as the verdicts split it
    summary = summary.assign(**{f"per_{short}": numeric_first(per_split(summary.label, key)[1].fillna("unset"))
                                for short, key in zip(keys_of, per)})
    for keys, g in summary.groupby(["train_len", *texts, *(f"per_{k}" for k in keys_of)], sort=True):
        tlen = keys[0]
        where = "".join(f", {c}={v}" for c, v in zip([*texts, *keys_of], keys[1:]))
        at_train = g[g.eval_len == tlen].dropna(subset=["ppl_mean"])
        if len(at_train) > 1:
            lo, hi = at_train.ppl_mean.min(), at_train.ppl_mean.max()
            what = "encodings" if (at_train.label == at_train.encoding).all() else "lines"
            worst = at_train.loc[at_train.vs_best.idxmax()] if at_train.vs_best.notna().any() else None
            # the highest line over the lowest as a ratio with its paired interval, the ratio itself the
            # interval's centre: as a 'spread' in % the interval's low end read '-0.4%' for a highest/lowest
            spread = f"highest / lowest {hi / lo:.3f}" if worst is None or math.isnan(worst.vs_best_ci_low) else \
                f"highest / lowest {worst.vs_best:.3f} {interval_text(worst.vs_best_ci_low, worst.vs_best_ci_high, 3)}"
            lines.append(f"train_len={tlen}{where}: ppl at train_len spans {lo:.2f} .. {hi:.2f} "
                         f"across {len(at_train)} {what} ({spread})")
            apart = at_train[at_train.tied_best.astype("boolean").eq(False).fillna(False).astype(bool)]
            if len(apart):
                best = at_train.loc[at_train.vs_best.idxmin(), "name"]
                verb = "differs" if len(apart) == 1 else "differ"
                lines.append(f"  warning: at train_len={tlen} {', '.join(apart.name)} {verb} from {best} by more "
                             f"than their 95% intervals: {_apart_why(at_train, apart, best)}")
        for name, e in g.groupby("name", sort=False):
            e = e.sort_values("eval_len")
            key = tuple(e.iloc[0][c] for c in LINE)
            if key in untrained:
                lines.append(f"  {name}: {untrained_text(*untrained[key])}")
                continue
            base = e[e.eval_len == tlen].ppl_mean
            if base.empty or math.isnan(base.iloc[0]):
                lines.append(f"  {name}: no perplexity at train_len={tlen} to compare with")
                continue
            longest = e.iloc[-1]
            ratio = "n/a" if math.isnan(longest.ratio_mean) else \
                f"{longest.ratio_mean:.3f} {interval_text(longest.ratio_ci_low, longest.ratio_ci_high, 3)}"
            holds, undecided = tlen, ""
            for r in e[e.eval_len > tlen].itertuples():
                if math.isnan(r.ratio_mean) or r.ratio_ci_low > NEAR:  # cannot run, or clearly beyond
                    break
                if not r.ratio_ci_high <= NEAR:  # the interval straddles 1.10, or there is none
                    why = "no interval" if math.isnan(r.ratio_ci_high) else "not distinguishable from 10%"
                    undecided = f"; L={r.eval_len}: {why}"
                    break
                holds = r.eval_len
            lines.append(f"  {name}: ppl(L={int(longest.eval_len)}) / ppl(L={tlen}) = {ratio}; "
                         f"within 10% of ppl(L={tlen}) up to L={holds} ({holds / tlen:g}x){undecided}")
    return lines


# ---------------------------------------------------------------- runs' extra tables
def _extra_tables(paths, df: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, tuple[pd.DataFrame, type | None]]]:
    """positions.csv rows, and each probe's rows (``<probe>.csv``, with its class where it can
    be imported here), under ``paths``, labelled, with each run's model, data and variant from
    its results rows (no config.yaml read again); empty where no run has them."""
    runs = df.groupby("run")[["model", "data", "variant"]].first()

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


def failures_markdown(failed: list[tuple[str, str]]) -> str:
    if not failed:
        return ""
    rows = [f"| {run} | {error.replace('|', '/')} |" for run, error in failed]
    return "\n".join([f"\n\n{len(failed)} failed run(s), no results:\n", "| run | error |", "|---|---|", *rows])


def read_reference(path: str | Path) -> pd.DataFrame:
    """A published results table (encoding, train_len, eval_len, ppl[, source, data, params,
    train_tokens]) for the figure's published panel; an empty ppl is a length the paper could not
    run. The packaged table gets the columns it lacks from :data:`REFERENCE_SETUP`."""
    path = Path(path)
    if not path.is_file():
        raise PosbenchError(f"report: --reference {str(path)!r} does not exist; pass a CSV with columns "
                            "encoding, train_len, eval_len, ppl, or --no-reference")
    ref = read_table(path)
    missing = [c for c in ("encoding", "train_len", "eval_len", "ppl") if c not in ref]
    if missing:
        raise PosbenchError(f"report: reference {str(path)!r} lacks column(s) {', '.join(missing)}; "
                            "valid: a CSV with columns encoding, train_len, eval_len, ppl")
    if path.resolve() == REFERENCE.resolve():
        ref = ref.assign(**{k: v for k, v in REFERENCE_SETUP.items() if k not in ref})
    return ref


# ---------------------------------------------------------------- what the figures are captioned with
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


def training_curves(df: pd.DataFrame, palette: Palette, setup: pd.DataFrame) -> pd.DataFrame:
    """Every run's logged training loss, one row per run and step, with ``tokens`` (step x
    batch_size x train_len) and the ``name`` of the figure line the run trained: its line with
    non-overlapping windows and no RoPE scaling (``alibi``, not ``alibi sliding/16``), else its
    first. Empty where no run has metrics.jsonl (shipped baselines have none)."""
    if "run" not in df:
        return pd.DataFrame()
    rows = with_labels(df) if "label" not in df else df
    rows = rows.assign(name=palette.names(rows),
                       plain=(rows["mode"] == "nonoverlapping") & (rows.rope_scaling == "none"))
    per_run = setup.set_index("run")
    frames = []
    for run, g in rows.groupby("run", sort=False):
        metrics = read_metrics(run)
        if metrics.empty:
            continue
        name = (g[g.plain] if g.plain.any() else g).name.iloc[0]
        per_step = per_run.batch_size.get(run, math.nan) * per_run.train_len.get(run, math.nan)
        frames.append(metrics[["step", "loss"]].assign(run=run, name=name, tokens=metrics.step * per_step))
    return pd.concat(frames, ignore_index=True).sort_values(["run", "step"]) if frames else pd.DataFrame()


def _setup_line(setup: pd.DataFrame) -> str:
    caption = setup_caption(setup)
    return f"Setup: {caption}." if caption else ""


def _reference_note(summary: pd.DataFrame, ref: pd.DataFrame | None, setup: pd.DataFrame) -> str:
    """Why report.png has no published panel, where a reference was asked for."""
    if ref is None or reference_lines(summary, ref, setup):
        return ""
    shared = ", ".join(sorted(set(summary.encoding) & set(ref.encoding))) or "none"
    source = ref.source.dropna().iloc[0] if "source" in ref and ref.source.notna().any() else "reference"
    theirs = "/".join(map(str, sorted(ref.train_len.unique())))
    ours = "/".join(map(str, sorted(summary.train_len.unique())))
    short = budget_short(setup)
    return (f"The published panel ({source}, train_len {theirs}) is left out: it is drawn beside a line with "
            f"non-overlapping windows and no RoPE scaling, of an encoding it has (here: {shared}), trained on "
            f"windows of >= {REFERENCE_MIN_TRAIN_LEN} tokens (here: train_len {ours}) and evaluated past it, "
            f"where every run trained on >= {amount(REFERENCE_MIN_TOKENS)} tokens"
            + (f" (here: {short})." if short else "."))


FIGURE_TEXT = {  # report.md's line under each figure
    "context": "Gain of the longer window by the token's offset in its train_len window (band: 95% interval "
               "over seeds and text); see ## Context.",
    "report": "Perplexity (band: 95% interval of each ppl) and ppl(L) / ppl(train_len) (band: the paired 95% "
              "interval of the ratio) vs L / train_len; hollow markers: cells with another seed count than "
              "the rest of their line.",
    "positions": f"Mean NLL by position in the window, each line at its longest window (L in the legend); bins fed by "
                 f"fewer than {MIN_BIN_WINDOWS} windows or {MIN_BIN_TOKENS} tokens per seed are left out.",
    "training": "Training loss vs training tokens, mean over seeds (band: min .. max).",
    "ranked": "Every line's ppl(Mx) / ppl(1x) (Mx: the longest multiple of train_len every line was evaluated "
              "at) and its ppl at 1x, each with its 95% interval, grouped by the hook its encoding uses and sorted "
              "by ratio.",
    "per": "Each line (named without the --per key) against the key's values: its ppl at train_len and its "
           "ppl(Mx) / ppl(1x) (Mx: the longest length every line reached), with their 95% intervals.",
    "tradeoff": "Perplexity at 1x against ppl(Mx) / ppl(1x), one labelled point per line with both 95% intervals; "
                "lower left is better on both. The right panel enlarges the lines whose ratio is at most "
                f"{ZOOM_RATIO:g}, where there are several.",
}


def _positions_note(windows: float) -> str:
    """Why report.md shows no positions.png: too few windows for its bins to mean anything."""
    return (f"No loss-by-position figure (positions.png): a bin is drawn where at least {MIN_BIN_WINDOWS} windows "
            f"(and {MIN_BIN_TOKENS} tokens) per seed feed it, and these runs' windows feed at most {windows:.0f} "
            "(the scored tokens over the window length). With fewer, a bin's mean is the text of those few windows "
            f"more than its position (docs/report.md); score more tokens (eval.max_tokens) to draw it.")


def _positions_part(positions: pd.DataFrame, drawn: pd.DataFrame, palette, setup: pd.DataFrame, log_y: bool,
                    figures: dict) -> str:
    """positions.png into ``figures`` where bins are fed (:func:`positions_windows`); -> report.md's
    note under the figures: why there is none, or the drawn lines it lacks (no positions.csv)."""
    if positions.empty:
        return ""
    windows = positions_windows(positions)
    if windows < MIN_BIN_WINDOWS:
        return _positions_note(windows)
    without = sorted(set(palette.names(drawn)) - set(palette.names(positions)))
    figures["positions"] = positions_figure(positions, log_y=log_y, palette=palette, setup=setup, without=without)
    return f"positions.png: {missing_positions(without)}." if without else ""


class Report(NamedTuple):
    summary: pd.DataFrame  # the tidy table (report.csv); empty where the paths hold only tasks.csv
    table: str  # Markdown or LaTeX, as asked; empty where the paths hold only tasks.csv
    text: list[str]  # the extrapolation summary lines
    files: list[Path]  # everything written
    tasks: TaskReport | None = None  # the algorithmic tasks' report, where the paths hold tasks.csv
    header: str = ""  # how the runs' setups differ (setup_header), above the table in report.md


def plot_ppl_vs_length(df: pd.DataFrame, path: Path, title: str | None = None) -> None:
    """One run's figure (:func:`posbench.report.figures.run_figure`), written to ``path``; captioned
    with the rows' setup (:func:`run_setup`) where ``df`` holds results rows."""
    summarized = "ppl_mean" in df
    setup = None if summarized else run_setup(df)
    save(run_figure(df if summarized else summarize(df), title, setup), Path(path))


def draw_run(run_dir: str | Path) -> None:
    """A run dir's own figures, drawn from its files by the command that trained or evaluated it,
    last: ppl_vs_length.png from results.csv (intervals from token_nll.npz), under the results
    lock so it shows the table as written, and learned_bias.png/.svg from the checkpoint where
    the encoding learns a bias, and ``<probe>.png`` from each probe's rows (passkey.csv, ...);
    each captioned with the run's setup (:func:`run_setup`)."""
    run = RunDir(run_dir)
    with locked(run.path):
        setup = ""
        if run.results.is_file():
            rows = backfill(read_results(run.results)).assign(run=str(run.path))
            plot_ppl_vs_length(rows, run.plot)
            setup = setup_caption(run_setup(rows))
        for name, cls in probe_files(run.path).items():
            rows = with_labels(read_table(run.path / f"{name}.csv"))
            fig = probe_figure(rows, name, getattr(cls, "metric", "accuracy"), getattr(cls, "grid", None))
            fig.suptitle(f"{name}: {run.path.name}" + (f"\n{setup}" if setup else ""), fontsize="medium")
            save(fig, run.path / f"{name}.png")
    found = trained_encoding(run.path)
    if found is not None:
        write_run_figure(found[1], run.path, caption=setup)


def report(paths: list[str | Path], out: str | Path | None = None, fmt: str = "md", log_y: bool = True,
           reference: str | Path | None = "auto", by: list[str] = (), baselines: list[str | Path] = (),
           threshold: float = THRESHOLD, mix: bool = False, lines: list[str] = (),
           contrasts: list[tuple[str, str] | str] = (), per: list[str] = (), strict_contrasts: bool = False) -> Report:
    """Gather results into ``out`` (default: the single directory given, else ./report):
    report.csv (tidy summary), report.md (table, failed jobs, extrapolation summary), report.html (the
    same lines to explore in a browser, offline: :mod:`posbench.report.html`), report.tex
    (``fmt='latex'``), report.png/.svg (perplexity and its ratio to the train length vs length,
    beside the paper's numbers from ``reference`` where the comparison means something
    (:func:`posbench.report.figures.reference_lines`): 'auto' is
    results/reference/alibi_paper_L512.csv where it exists, None none), training.png/.svg where
    runs have metrics.jsonl, and positions.png/.svg and <probe>.png/.svg where runs have
    positions.csv / a probe's rows (passkey.csv, ...). All figures share one colour per line.
    ``by``: config keys whose values tell lines apart (see the module docstring); ``baselines``:
    shipped runs' folders (:mod:`posbench.report.baselines`) reported beside ``paths``;
    ``threshold``: the score a probe's effective length keeps (:mod:`posbench.report.probes`);
    ``mix``: report runs scored on different text together (:func:`check_one_text` refuses them
    otherwise), each text's lines apart; ``lines``: the line names (``--lines``, commas outside
    brackets split them) that the per-line figures draw; ``contrasts``: (line A, line B) pairs (or 'A/B' texts) whose
    ratios report.md's verdicts compare (:mod:`posbench.report.verdicts`); ``per``: keys of ``by`` whose
    values split the verdicts' setups instead of their lines (a budget study's orderings per budget);
    ``strict_contrasts``: a contrast naming no line of the report is refused, not said to be missing.
    A report of more than
    :data:`~posbench.report.ranked.MANY_LINES` lines draws ranked.png and tradeoff.png
    (:mod:`posbench.report.ranked`), one point per line, and the per-line figures for ``lines``
    or the lines :func:`~posbench.report.ranked.pick_lines` picks.
    Where runs have tasks.csv, also the task report (:func:`posbench.report.tasks.write_task_report`:
    tasks_report.csv/.md, tasks.png/.svg); where they have only tasks.csv, only that."""
    if fmt not in ("md", "latex"):
        raise PosbenchError(f"report: --format {fmt!r} is not valid; valid choices: md, latex")
    out = report_dir(paths, out)
    paths = list(paths) + list(baselines)  # shipped runs (posbench.report.baselines) read as run dirs
    failed = failed_runs(paths)
    tasks = read_tasks(paths)
    if tasks.empty or find_files(paths, RESULTS):
        done = ppl_report(paths, out, fmt, log_y, reference, failed, by, threshold, mix, lines, contrasts, per,
                          strict_contrasts)
        footer = ""
    else:
        done, footer = Report(pd.DataFrame(), "", [], []), failures_markdown(failed)
    if tasks.empty:
        return done
    task = write_task_report(tasks, out, footer)
    return done._replace(files=done.files + task.files, tasks=task)


def probes_section(probes: dict, threshold: float) -> tuple[str, pd.DataFrame, list[str]]:
    """report.md's probe section (each probe's score by length with its interval, and each line's
    effective length: :mod:`posbench.report.probes`), the rows of probes.csv, and the sentences."""
    parts, tables, sentences = [], [], []
    for name, (rows, cls) in probes.items():
        summary = probe_summary(rows, getattr(cls, "metric", "accuracy"))
        if summary.empty:
            continue
        found = effective_length_lines(summary, name, threshold)
        sentences += found
        tables.append(summary.assign(probe=name))
        parts.append(f"### {name}\n\n{probe_markdown(summary)}\n\n" + "".join(f"- {t}\n" for t in found))
    if not parts:
        return "", pd.DataFrame(), []
    text = ("\n## Probes\n\nScore by length, pooled over depths and seeds, with its 95% interval (Wilson's over the "
            "prompts, widened to the seeds' t interval where a line has several seeds) and the prompts counted. "
            f"Effective length (RULER's rule): the longest length up to which the score stays >= {threshold:g} at "
            "every length probed; its interval applies the rule to the interval's bounds.\n\n" + "\n".join(parts))
    table = pd.concat(tables, ignore_index=True)
    return text, table[["probe"] + [c for c in table if c != "probe"]], sentences


def _figure_list(figures: dict, said: dict[str, str]) -> str:
    """report.md's figures, each with the line that says what it shows."""
    return "".join(f"\n![{name}]({name}.png)\n" + (f"\n{said[name]}\n" if name in said else "") for name in figures)


def ppl_report(paths: list[str | Path], out: Path, fmt: str, log_y: bool, reference: str | Path | None,
               failed: list[tuple[str, str]], by: list[str] = (), threshold: float = THRESHOLD,
               mix: bool = False, lines: list[str] = (), contrasts: list[tuple[str, str] | str] = (),
               per: list[str] = (), strict_contrasts: bool = False) -> Report:
    """The perplexity part of :func:`report`, from the results.csv files under ``paths``."""
    try:
        df = collect(paths, by=by)
    except PosbenchError as e:
        if not failed:
            raise
        raise PosbenchError(f"{e}; {len(failed)} run(s) failed: "
                            + "; ".join(f"{run}: {error}" for run, error in failed)) from e
    df, mixed = texts_apart(df, mix)
    check_one_config(df)
    check_one_run_per_seed(df)
    positions, probes = _extra_tables(paths, df)
    ref = None
    if reference is not None and (reference != "auto" or REFERENCE.is_file()):
        ref = read_reference(REFERENCE if reference == "auto" else reference)
    summary = summarize(df, cells=True, per=per)
    untrained = untrained_lines(df)
    verdicts = verdict_lines(summary, contrasts, per=per, strict=strict_contrasts, untrained=untrained)
    summary = summary.drop(columns=list(CELL_COLUMNS))
    text = extrapolation_summary(summary, per, untrained)
    table = markdown_table(summary)
    setup = run_setup(df)
    header = setup_header(df, setup, mixed)
    shown = choose_lines(summary, lines)  # past MANY_LINES: one point per line, per-line figures for some
    palette, keep = shown.palette, shown.keep  # one colour per line in every figure
    figures = shown.figures(setup)
    drawn = keep(summary)
    figures["report"] = ppl_figure(drawn, ref, log_y=log_y, palette=palette, setup=setup)
    figures.update(per_figures(summary, per, setup))
    positions_note = _positions_part(keep(positions), drawn, palette, setup, log_y, figures)
    curves = keep(training_curves(df, palette, setup), "name")
    if not curves.empty:
        figures["training"] = training_figure(curves, palette, setup[setup.run.isin(set(curves.run))])
    for name, (rows, cls) in probes.items():
        figures[name] = probe_figure(rows, name, getattr(cls, "metric", "accuracy"), getattr(cls, "grid", None))
        _caption(figures[name], setup[setup.run.isin(set(rows.run))])
    files = [out / "report.csv", out / "report.md"]
    atomic_write_text(files[0], summary.to_csv(index=False))
    probe_text, probe_table, probe_lines = probes_section(probes, threshold)
    if not probe_table.empty:
        files.append(out / "probes.csv")
        atomic_write_text(files[-1], probe_table.to_csv(index=False))
    gain = context_gain(df, names=palette.names)  # runs with sliding rows past train_len
    if not gain.empty:
        files.append(out / "context.csv")
        atomic_write_text(files[-1], gain.to_csv(index=False))
        if not keep(gain, "line").empty:
            figures["context"] = context_figure(keep(gain, "line"), palette, setup)
    long_text, long_files = longppl_part(paths, out)  # where posbench longppl wrote longppl.csv
    files += long_files
    notes = (_setup_line(setup), _reference_note(drawn, ref, setup), positions_note)
    atomic_write_text(files[1], (f"{header}\n\n" if header else "")
                      + f"{table}\n\nCells: {TABLE_NOTE}.{failures_markdown(failed)}"
                      "\n\n## Length extrapolation\n\n"
                      + "".join(f"- {line.strip()}\n" for line in text)
                      + verdicts_markdown(verdicts)
                      + probe_text + context_markdown(gain) + long_text
                      + "\n## Figures\n\n" + "".join(f"{t}\n\n" for t in notes if t)
                      + _figure_list(figures, shown.texts(FIGURE_TEXT)))
    files.append(write_html(out / "report.html", summary, f"posbench report: {out.resolve().name}", text, verdicts,
                            header))
    if fmt == "latex":
        table = latex_table(summary)
        files.append(out / "report.tex")
        atomic_write_text(files[-1], table + "\n")
    for name, fig in figures.items():
        files += save(fig, out / f"{name}.png", also_svg=True)
    # learned_bias.png/.svg, runs with a learned bias
    files += write_report_figure(sorted(set(df.run)), out, caption=setup_caption(setup))
    return Report(summary, table + failures_markdown(failed), text + probe_lines, files, header=header)
