"""The summary as people read it: the Markdown and LaTeX tables, the extrapolation summary's
sentences (the range at train_len, each line's ratio and how far it stays within 10%), and the
failed runs' table."""

from __future__ import annotations

import math

import pandas as pd

from ..eval.results import LINE, line_names, with_labels
from .figures import seed_counts
from .summary import COMPARED
from .verdicts import UNTRAINED, numeric_first, per_value

NEAR = 1.10  # "holds up": ppl at most 10% above its value at train_len


PARAMS_HEAD = {"params": "params (position)"}  # table header of the parameter-count column


TABLE_NOTE = ("geometric mean ± std over seeds [95% interval covering the seeds' spread and the text's (a "
              "block bootstrap over the scored tokens), centred on the geometric mean; a line of one seed: the "
              "text's only]; bold: the lowest ppl of a column and every line whose 95% "
              "interval of the ratio to it contains 1 (none where a comparison has no interval); '(1 seed)': a "
              "cell averaged over a different number of seeds than the rest of its line (the seeds column)")


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
    summary = summary.assign(**{f"per_{short}": numeric_first(per_value(summary, key).fillna("unset"))
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


def failures_markdown(failed: list[tuple[str, str]]) -> str:
    if not failed:
        return ""
    rows = [f"| {run} | {error.replace('|', '/')} |" for run, error in failed]
    return "\n".join([f"\n\n{len(failed)} failed run(s), no results:\n", "| run | error |", "|---|---|", *rows])
