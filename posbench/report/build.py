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

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from ..config import shipped_dir
from ..errors import PosbenchError
from ..eval.probes import probe_files
from ..eval.results import (
    RESULTS,
    as_trained,
    backfill,
    find_files,
    locked,
    read_results,
    read_table,
    report_dir,
    with_labels,
)
from ..runs.rundir import RunDir, atomic_write_text
from .collect import (
    _extra_tables,
    check_one_config,
    check_one_run_per_seed,
    collect,
    failed_runs,
    read_metrics,
    run_setup,
    setup_header,
    texts_apart,
)
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
    setup_caption,
    training_figure,
)
from .html import write_html
from .learned_bias import trained_encoding, write_report_figure, write_run_figure
from .longppl import longppl_part
from .per import per_figures
from .probes import THRESHOLD, effective_length_lines, probe_markdown, probe_summary
from .ranked import ZOOM_RATIO, choose_lines
from .render import TABLE_NOTE, extrapolation_summary, failures_markdown, latex_table, markdown_table
from .summary import CELL_COLUMNS, summarize, untrained_lines
from .tasks import TaskReport, read_tasks, write_task_report
from .verdicts import verdict_lines, verdicts_markdown

REFERENCE = (shipped_dir("reference") or Path("results/reference")) / "alibi_paper_L512.csv"  # wheel or checkout


# What the packaged reference's rows leave out, for its panel's title: the paper's WikiText-103 model
# (Press et al. 2022, sec. 4; conf/model/alibi_paper.yaml), 247M parameters, 286k updates of 73,728
# tokens (conf/experiment/alibi_paper.yaml). A --reference CSV may carry these columns itself.
REFERENCE_SETUP = {"data": "WikiText-103", "params": 247_000_000, "train_tokens": 286_000 * 73_728}


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


def training_curves(df: pd.DataFrame, palette: Palette, setup: pd.DataFrame) -> pd.DataFrame:
    """Every run's logged training loss, one row per run and step, with ``tokens`` (step x
    batch_size x train_len) and the ``name`` of the figure line the run trained: its line with
    non-overlapping windows and no RoPE scaling (``alibi``, not ``alibi sliding/16``), else its
    first. Empty where no run has metrics.jsonl (shipped baselines have none)."""
    if "run" not in df:
        return pd.DataFrame()
    rows = with_labels(df) if "label" not in df else df
    rows = rows.assign(name=palette.names(rows),
                       plain=(rows["mode"] == "nonoverlapping") & as_trained(rows))
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


@dataclass(frozen=True)
class ReportOptions:
    """What a report is asked for: ``posbench report``'s flags, a study file's ``report:`` keys.

    ``fmt``: ``md``, or ``latex`` for report.tex too; ``log_y``: the perplexity axis in log scale;
    ``reference``: the paper's numbers beside ours where the comparison means something
    (:func:`posbench.report.figures.reference_lines`): 'auto' is
    results/reference/alibi_paper_L512.csv where it exists, None none; ``by``: config keys whose
    values tell lines apart (the module docstring); ``baselines``: shipped runs' folders
    (:mod:`posbench.report.baselines`) reported beside the paths; ``threshold``: the score a
    probe's effective length keeps (:mod:`posbench.report.probes`); ``mix``: report runs scored on
    different text together (:func:`~posbench.report.collect.check_one_text` refuses them
    otherwise), each text's lines apart; ``lines``: the line names (``--lines``, commas outside
    brackets split them) that the per-line figures draw; ``contrasts``: (line A, line B) pairs (or
    'A/B' texts) whose ratios report.md's verdicts compare (:mod:`posbench.report.verdicts`);
    ``per``: keys of ``by`` whose values split the verdicts' setups instead of their lines (a budget
    study's orderings per budget); ``strict_contrasts``: a contrast naming no line of the report is
    refused, not said to be missing."""

    fmt: str = "md"
    log_y: bool = True
    reference: str | Path | None = "auto"
    by: Sequence[str] = ()
    baselines: Sequence[str | Path] = ()
    threshold: float = THRESHOLD
    mix: bool = False
    lines: Sequence[str] = ()
    contrasts: Sequence[tuple[str, str] | str] = ()
    per: Sequence[str] = ()
    strict_contrasts: bool = False

    def __post_init__(self):
        if self.fmt not in ("md", "latex"):
            raise PosbenchError(f"report: --format {self.fmt!r} is not valid; valid choices: md, latex")


def report(paths: list[str | Path], out: str | Path | None = None, options: ReportOptions | None = None,
           **asked) -> Report:
    """Gather results into ``out`` (default: the single directory given, else ./report), as
    ``options`` ask (:class:`ReportOptions`; its fields may also be given by name, ``fmt="latex"``):
    report.csv (tidy summary), report.md (table, failed jobs, extrapolation summary), report.html (the
    same lines to explore in a browser, offline: :mod:`posbench.report.html`), report.tex
    (``fmt='latex'``), report.png/.svg (perplexity and its ratio to the train length vs length,
    beside the paper's numbers from ``reference`` where the comparison means something
    (:func:`posbench.report.figures.reference_lines`): 'auto' is
    results/reference/alibi_paper_L512.csv where it exists, None none), training.png/.svg where
    runs have metrics.jsonl, and positions.png/.svg and <probe>.png/.svg where runs have
    positions.csv / a probe's rows (passkey.csv, ...). All figures share one colour per line.
    A report of more than
    :data:`~posbench.report.ranked.MANY_LINES` lines draws ranked.png and tradeoff.png
    (:mod:`posbench.report.ranked`), one point per line, and the per-line figures for ``lines``
    or the lines :func:`~posbench.report.ranked.pick_lines` picks.
    Where runs have tasks.csv, also the task report (:func:`posbench.report.tasks.write_task_report`:
    tasks_report.csv/.md, tasks.png/.svg); where they have only tasks.csv, only that."""
    options = replace(options or ReportOptions(), **asked)
    out = report_dir(paths, out)
    paths = list(paths) + list(options.baselines)  # shipped runs (posbench.report.baselines) read as run dirs
    failed = failed_runs(paths)
    tasks = read_tasks(paths)
    if tasks.empty or find_files(paths, RESULTS):
        done = ppl_report(paths, out, options, failed)
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


def ppl_report(paths: list[str | Path], out: Path, options: ReportOptions, failed: list[tuple[str, str]]) -> Report:
    """The perplexity part of :func:`report`, from the results.csv files under ``paths``."""
    o, per = options, list(options.per)
    try:
        df = collect(paths, by=list(o.by))
    except PosbenchError as e:
        if not failed:
            raise
        raise PosbenchError(f"{e}; {len(failed)} run(s) failed: "
                            + "; ".join(f"{run}: {error}" for run, error in failed)) from e
    df, mixed = texts_apart(df, o.mix)
    check_one_config(df)
    check_one_run_per_seed(df)
    positions, probes = _extra_tables(paths, df)
    ref = None
    if o.reference is not None and (o.reference != "auto" or REFERENCE.is_file()):
        ref = read_reference(REFERENCE if o.reference == "auto" else o.reference)
    summary = summarize(df, cells=True, per=per)
    untrained = untrained_lines(df)
    verdicts = verdict_lines(summary, list(o.contrasts), per=per, strict=o.strict_contrasts, untrained=untrained)
    summary = summary.drop(columns=list(CELL_COLUMNS))
    text = extrapolation_summary(summary, per, untrained)
    table = markdown_table(summary)
    setup = run_setup(df)
    header = setup_header(df, setup, mixed)
    shown = choose_lines(summary, list(o.lines))  # past MANY_LINES: one point per line, per-line figures for some
    palette, keep = shown.palette, shown.keep  # one colour per line in every figure
    figures = shown.figures(setup)
    drawn = keep(summary)
    figures["report"] = ppl_figure(drawn, ref, log_y=o.log_y, palette=palette, setup=setup)
    figures.update(per_figures(summary, per, setup))
    positions_note = _positions_part(keep(positions), drawn, palette, setup, o.log_y, figures)
    curves = keep(training_curves(df, palette, setup), "name")
    if not curves.empty:
        figures["training"] = training_figure(curves, palette, setup[setup.run.isin(set(curves.run))])
    for name, (rows, cls) in probes.items():
        figures[name] = probe_figure(rows, name, getattr(cls, "metric", "accuracy"), getattr(cls, "grid", None))
        _caption(figures[name], setup[setup.run.isin(set(rows.run))])
    files = [out / "report.csv", out / "report.md"]
    atomic_write_text(files[0], summary.to_csv(index=False))
    probe_text, probe_table, probe_lines = probes_section(probes, o.threshold)
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
    if o.fmt == "latex":
        table = latex_table(summary)
        files.append(out / "report.tex")
        atomic_write_text(files[-1], table + "\n")
    for name, fig in figures.items():
        files += save(fig, out / f"{name}.png", also_svg=True)
    # learned_bias.png/.svg, runs with a learned bias
    files += write_report_figure(sorted(set(df.run)), out, caption=setup_caption(setup))
    return Report(summary, table + failures_markdown(failed), text + probe_lines, files, header=header)
