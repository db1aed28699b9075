"""Length extrapolation at matched in-distribution perplexity (``posbench report --matched``).

Every report warns that its lines differ at train_len beyond their intervals, so a ratio
ppl(16x) / ppl(1x) compares models at different stages of training. This table compares them
where they are equally good in distribution: each line is read at the training budget where its
ppl at train_len reaches a common target (by default the worst line's value at its largest
budget, so every line reaches it).

**The runs.** Each line trained at several budgets (``train.steps``), each a finished run with its
own decay: a warmup-stable-decay run at the largest budget keeps its checkpoints at the shorter
budgets' decay starts (``train.save_steps``) and each shorter budget branches off it
(``train.branch_from``; a study's ``from:`` stage, conf/study/matched.yaml), which gives the
numbers a run from scratch gives (tests/test_branch.py). A stable-phase checkpoint is not a
finished model and is never read.

**Finding the matched budget.** Per line, its budgets B_1 < ... < B_n with their geometric-mean
ppl at train_len p_1, ..., p_n over the line's seeds that ran at every one of its budgets (each
branch paired with its seed's long run; a seed missing a budget is left out of the whole line, so
no budget's mean is of other seeds than its neighbours'). The target is bracketed by the first two
neighbouring budgets where p crosses it from above (p need not fall all the way: on a corpus the
budget repeats, ppl at train_len can rise again at the largest budgets, and the table shows each
line's lowest p and where it was; the first crossing is the least training that reaches the
target), and the matched budget
is interpolated linearly in log ppl against log tokens: w = (log p_lo - log target) /
(log p_lo - log p_hi), log B* = (1 - w) log B_lo + w log B_hi. The matched ratio is the same
interpolation of the line's log ratios: each seed's (1 - w) log r_lo + w log r_hi, with its
text's blocks combined alike, so :mod:`posbench.intervals` gives its interval (seeds and text;
w is taken as known: the interval does not carry the uncertainty of where the target is
crossed, which the bracketing budgets' spacing bounds). A line whose largest budget does not
reach the target, or whose smallest already is below it, has no matched value (no
extrapolation past the budgets trained), and the table says which.

**Verdicts.** The matched ratios are ordered only where every line has two or more seeds: a line
of one seed has an interval of its text alone (:mod:`posbench.intervals`), and the seeds of one
encoding part at 16x by far more than the text moves them (the headline's RoPE: 3.99 .. 4.54).
The figure (``matched.png``) draws each line's ppl at train_len and its 16x ratio against the
training tokens, the target and the matched points on them.

**Across setups** (a size axis: the same lines at several model sizes, or train lengths). A line
is one label in one setup (model, data, train_len, split), named as the report's figures name
it (``rope (model=small)``), so two sizes are never pooled as one line's seeds. A bigger model
at the same budget is also a less trained one, so a size trend read at one budget can be
training stage; two comparisons take it away, each an ordering of one label's setups
(:func:`setup_verdicts`):

- *at matched ppl(train_len)*: each label at its own target, the highest of its setups' ppl at
  train_len at their largest budgets (every setup reaches it; ``--target`` sets one for all),
  each setup read where its ppl crosses it (above);
- *at equal tokens per parameter*: each label's budgets whose training tokens per parameter
  (tokens over the rows' ``params``) agree within 5% across setups (a study that branches each
  size's decays at the budgets where sizes meet, conf/study/scale_matched.yaml), the 16x ratios
  of those budgets as trained (no interpolation).

Their setups differ in their models, so each pair's interval is the unpaired one (the seeds'
variances of both, plus the text's where they scored the same tokens), the pairs of one
ordering held at a family-wise 5% (:func:`posbench.report.verdicts.decide_pairs`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from ..errors import PosbenchError
from ..eval.results import LINE, as_trained, line_names, with_labels
from ..intervals import Cell, Estimator, pool_seeds
from ..runs.rundir import atomic_write_text
from .verdicts import PREFIX, ordering, ratio_cell

COLUMNS = ["label", "target", "matched_tokens", "budget_lo", "budget_hi", "weight", "ppl_1x_lo", "ppl_1x_hi",
           "ratio", "ratio_ci_low", "ratio_ci_high", "final_tokens", "final_ppl_1x", "final_ratio", "lowest_tokens",
           "lowest_ppl_1x", "seeds", "seed_ratios", "note"]


def blend(a: Cell, b: Cell, w: float) -> Cell:
    """(1 - w) a + w b per seed (the seeds both have) and per text block: a log ratio interpolated
    between two budgets, paired as its parts are."""
    common, ia, ib = np.intersect1d(a.seeds, b.seeds, return_indices=True)
    blocks = sizes = None
    if a.blocks is not None and b.blocks is not None and np.array_equal(a.sizes, b.sizes):
        blocks, sizes = (1 - w) * a.blocks[ia] + w * b.blocks[ib], a.sizes
    return Cell(common, (1 - w) * a.nll[ia] + w * b.nll[ib], blocks, sizes, a.tokens_id if blocks is not None else ())


def train_tokens(rows: pd.DataFrame, steps: int) -> int:
    """Training tokens of a budget: steps x train.batch_size x train_len from its first run's
    config.yaml (the steps alone where the rows carry no run dir)."""
    import yaml

    run = rows["run"].iloc[0] if "run" in rows else None
    config = Path(str(run)) / "config.yaml"
    if not isinstance(run, str) or not config.is_file():
        return steps
    train = (yaml.safe_load(config.read_text()) or {}).get("train", {})
    return steps * int(train.get("batch_size", 1)) * int(train.get("train_len", rows.train_len.iloc[0]))


class Line(NamedTuple):
    """One line of the matched table: its ``label`` in one ``setup`` ('model=small, train_len=512'
    where the report's setups differ, else ''), its parameter count (NaN where the rows predate
    it), and its ``budgets``: steps -> (cell at train_len, the log-ratio cell at the longest length,
    training tokens)."""

    label: str
    setup: str
    params: float
    budgets: dict[int, tuple[Cell, Cell, int]]


def budget_cells(df: pd.DataFrame) -> dict[str, Line]:
    """Each line's name (its label, with the setup where setups differ: :func:`line_names`) -> its :class:`Line`."""
    from .collect import check_one_run_per_seed
    from .summary import _cells

    df = with_labels(df.assign(variant=""))
    check_one_run_per_seed(df, also=("steps",))  # a budget's seed from two runs would count twice
    df = df[(df["mode"] == "nonoverlapping") & as_trained(df) & (df.status == "ok")]
    df = df.assign(name=line_names(df))
    varied = [c for c in LINE[1:] if c in df and df[c].nunique() > 1]
    out: dict[str, Line] = {}
    setup_of = [c for c in LINE[1:] if c in df]  # each setup's longest length: another train_len's 16x is its own
    df = df.assign(longest=df.groupby(setup_of, dropna=False).eval_len.transform("max"))
    for (name, steps), g in df.groupby(["name", "steps"]):
        tlen, far = int(g.train_len.iloc[0]), int(g.longest.iloc[0])
        lengths = sorted(g.eval_len.unique())
        cells = dict(zip(lengths, _cells(g)))  # GROUP order: eval_len last
        if tlen not in cells or far not in cells:
            continue
        if name not in out:
            setup = ", ".join(f"{c}={g[c].iloc[0]}" for c in varied)
            params = float(g.params.max()) if "params" in g and g.params.notna().any() else math.nan
            out[name] = Line(str(g.label.iloc[0]), setup, params, {})
        tokens = train_tokens(g, int(steps))
        out[name].budgets[int(steps)] = (cells[tlen], ratio_cell(cells[far], cells[tlen]), tokens)
    return {name: line._replace(budgets=_common_seeds(line.budgets)) for name, line in out.items()}


def _common_seeds(budgets: dict[int, tuple[Cell, Cell, int]]) -> dict[int, tuple[Cell, Cell, int]]:
    """The line's cells restricted to the seeds that ran at every one of its budgets."""
    common = None
    for at, ratio, _ in budgets.values():
        seeds = np.intersect1d(at.seeds, ratio.seeds)
        common = seeds if common is None else np.intersect1d(common, seeds)

    def only(c: Cell) -> Cell:
        return c.only(np.flatnonzero(np.isin(c.seeds, common)))

    return {steps: (only(at), only(ratio), tokens) for steps, (at, ratio, tokens) in budgets.items()}


def matched_table(df: pd.DataFrame, target: float | None = None, estimator: Estimator | None = None,
                  lines: dict | None = None):
    """The matched table (module docstring) and the per-line matched ratio cells (for verdicts);
    ``lines``: :func:`budget_cells` of ``df``, where the caller has them already."""
    est = estimator or Estimator()
    lines = budget_cells(df) if lines is None else lines
    lines = {k: v for k, v in lines.items() if len(v.budgets) >= 2 and next(iter(v.budgets.values()))[0].nll.size}
    if not lines:
        raise PosbenchError("report --matched: no line has runs at two or more budgets (train.steps); valid: runs "
                            "of one line at several budgets, e.g. `posbench study matched`")
    final = {name: math.exp(line.budgets[max(line.budgets)][0].mean) for name, line in lines.items()}
    goals = targets(lines, final, target)
    pool = pool_seeds(r.nll for line in lines.values() for _, r, _ in line.budgets.values())
    rows, matched = [], {}
    for label, line in sorted(lines.items()):
        budgets, goal = line.budgets, goals[label]
        steps = sorted(budgets)
        ppl = [math.exp(budgets[s][0].mean) for s in steps]
        last = budgets[steps[-1]]
        best = int(np.argmin(ppl))
        row = {"label": label, "target": goal, "final_tokens": last[2], "final_ppl_1x": ppl[-1],
               "final_ratio": math.exp(last[1].mean), "lowest_tokens": budgets[steps[best]][2],
               "lowest_ppl_1x": ppl[best], "seeds": int(last[0].nll.size), "note": ""}
        crossing = [i for i in range(len(steps) - 1) if ppl[i] >= goal >= ppl[i + 1]]
        if not crossing:
            row["note"] = ("not reached: its largest budget ends above the target" if ppl[-1] > goal else
                           "below the target already at its smallest budget")
            rows.append(row)
            continue
        i = crossing[0]
        lo, hi = budgets[steps[i]], budgets[steps[i + 1]]
        span = math.log(ppl[i]) - math.log(ppl[i + 1])
        w = 0.0 if span == 0 else (math.log(ppl[i]) - math.log(goal)) / span
        cell = blend(lo[1], hi[1], w)
        iv = est.cell(cell, pool)
        matched[label] = cell
        row.update(matched_tokens=math.exp((1 - w) * math.log(lo[2]) + w * math.log(hi[2])), budget_lo=lo[2],
                   budget_hi=hi[2], weight=w, ppl_1x_lo=ppl[i], ppl_1x_hi=ppl[i + 1], ratio=math.exp(iv.estimate),
                   ratio_ci_low=math.exp(iv.low), ratio_ci_high=math.exp(iv.high), seed_ratios=seed_ratios(cell))
        rows.append(row)
    return pd.DataFrame(rows).reindex(columns=COLUMNS), matched, pool


def targets(lines: dict[str, Line], final: dict[str, float], target: float | None) -> dict[str, float]:
    """Each line's target ppl at train_len: ``target`` where given; else, in one setup, the worst
    line's at its largest budget (``final``), so every line reaches it; across setups, each
    label's own: the highest of its setups' (module docstring)."""
    if target is not None:
        return {name: float(target) for name in lines}
    if len({line.setup for line in lines.values()}) == 1:
        return {name: max(final.values()) for name in lines}
    worst = {}
    for name, line in lines.items():
        worst[line.label] = max(worst.get(line.label, 0.0), final[name])
    return {name: worst[line.label] for name, line in lines.items()}


TPP_TOLERANCE = 1.05  # budgets whose tokens per parameter agree within 5% count as one value


def setup_verdicts(lines: dict[str, Line], table: pd.DataFrame, matched: dict[str, Cell], pool,
                   estimator: Estimator | None = None) -> list[str]:
    """Across setups (module docstring), for each label with two or more setups: its matched
    ratios, one ordering of its setups; and, at each tokens-per-parameter value two or more of its
    setups share (within :data:`TPP_TOLERANCE`), the ordering of their 16x ratios there."""
    est = estimator or Estimator()
    out = []
    by_label: dict[str, list[str]] = {}
    for name, line in sorted(lines.items()):
        by_label.setdefault(line.label, []).append(name)
    goal = table.set_index("label").target
    for label, names in by_label.items():
        if len({lines[n].setup for n in names}) < 2:
            continue
        found = {lines[n].setup: matched[n] for n in names if n in matched}
        target = float(goal[names[0]])
        if len(found) >= 2:
            out.append(_setup_ordering(est, found, pool, f"{label} matched at ppl(train_len) = {target:.2f} across "
                                                         "setups"))
        elif names:
            missing = sorted(lines[n].setup for n in names if n not in matched)
            out.append(f"no verdict for {label} at ppl(train_len) = {target:.2f} across setups: "
                       f"{', '.join(missing)} do{'es' if len(missing) == 1 else ''} not cross it within "
                       "its budgets")
        for tpp, cells in shared_budgets([lines[n] for n in names]):
            out.append(_setup_ordering(est, cells, pool, f"{label} at {tpp:.2f} tokens a parameter across setups"))
    return out


def shared_budgets(lines: list[Line]) -> list[tuple[float, dict[str, Cell]]]:
    """The tokens-per-parameter values two or more of ``lines`` (one label's setups) share within
    :data:`TPP_TOLERANCE` -> (the value, the geometric mean of theirs; setup ('setup (N tokens)') ->
    its ratio cell at that budget), lowest value first. Each setup's budget nearest the value
    joins; lines without a parameter count share nothing."""
    budgets = sorted((tokens / line.params, line.setup, tokens, ratio) for line in lines if line.params > 0
                     for _, ratio, tokens in line.budgets.values())
    out, used = [], set()
    for i, (tpp, setup, _, _) in enumerate(budgets):
        if i in used:
            continue
        near = [j for j in range(i, len(budgets)) if budgets[j][0] <= tpp * TPP_TOLERANCE and j not in used]
        chosen: dict[str, int] = {}
        for j in near:  # each setup's nearest budget to the group's first value
            s = budgets[j][1]
            if s not in chosen or abs(math.log(budgets[j][0] / tpp)) < abs(math.log(budgets[chosen[s]][0] / tpp)):
                chosen[s] = j
        if len(chosen) < 2:
            continue
        used.update(chosen.values())
        value = math.exp(np.mean([math.log(budgets[j][0]) for j in chosen.values()]))
        out.append((value, {f"{s} ({_fmt_tokens(budgets[j][2])} tokens)": budgets[j][3] for s, j in chosen.items()}))
    return out


def _setup_ordering(est: Estimator, cells: dict[str, Cell], pool, what: str) -> str:
    """One ordering of a label's setups by their 16x ratio cells, or why there is none (one seed)."""
    few = sorted(n for n, c in cells.items() if c.nll.size < 2)
    if few:
        return (f"no verdict for {what}: {', '.join(few)} ha{'s' if len(few) == 1 else 've'} one seed, whose "
                "interval holds the text's variation alone")
    values = {n: math.exp(c.mean) for n, c in cells.items()}
    return f"{PREFIX}{what}, the 16x ratio, lowest first: " + ordering(est, cells, values, pool, 3)


def matched_verdict(matched: dict[str, Cell], pool, goal: float, estimator: Estimator | None = None) -> list[str]:
    """The ordering of the matched ratios, lowest first, as report.md's verdicts write orderings."""
    if len(matched) < 2:
        return []
    few = sorted(n for n, c in matched.items() if c.nll.size < 2)
    if few:
        return [f"no verdict at ppl(train_len) = {goal:.2f}: {', '.join(few)} ha{'s' if len(few) == 1 else 've'} one "
                "seed, whose interval holds the text's variation alone"]
    values = {n: math.exp(c.mean) for n, c in matched.items()}
    return [f"{PREFIX}matched at ppl(train_len) = {goal:.2f}, the 16x ratio, lowest first: "
            + ordering(estimator or Estimator(), matched, values, pool, 3)]


def seed_ratios(cell: Cell) -> str:
    """Each seed's matched 16x ratio, ``seed:ratio`` joined by spaces (the line's ratio is their
    geometric mean; the interval adds the text's variation to their spread)."""
    return " ".join(f"{int(s)}:{math.exp(v):.3f}" for s, v in zip(cell.seeds, cell.nll))


def _fmt_tokens(x) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x / 1e6:.2f}M"


def matched_markdown(table: pd.DataFrame, verdicts: list[str], across: bool = False) -> str:
    """matched.md: the table and its verdicts; ``across``: the lines are of several setups, each
    label matched at its own target (:func:`targets`)."""
    head = ("| line | seeds | matched budget (bracket) | ppl at 1x there | 16x ratio there [95% interval] | "
            "each seed's 16x ratio there | at its largest budget: tokens, ppl at 1x, 16x ratio | "
            "its lowest ppl at 1x (tokens) |")
    rows = [head, "|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        if r.note:
            there = f"{r.note} | | | "
        else:
            there = (f"{_fmt_tokens(r.matched_tokens)} ({_fmt_tokens(r.budget_lo)} .. {_fmt_tokens(r.budget_hi)}) | "
                     f"{r.target:.2f} | {r.ratio:.3f} [{r.ratio_ci_low:.3f}, {r.ratio_ci_high:.3f}] | "
                     + ", ".join(r.seed_ratios.split()))
        rows.append(f"| {r.label} | {r.seeds} | {there} | {_fmt_tokens(r.final_tokens)}, {r.final_ppl_1x:.2f}, "
                    f"{r.final_ratio:.3f} | {r.lowest_ppl_1x:.2f} ({_fmt_tokens(r.lowest_tokens)}) |")
    target = f"{table.target.iloc[0]:.2f}" if not across else \
        "each line's own, the highest of its label's setups' at their largest budgets: " + ", ".join(
            f"{r.label} {r.target:.2f}" for r in table.itertuples())
    return ("# Length extrapolation at matched in-distribution perplexity\n\n"
            f"Target ppl at train_len: {target}. How the matched budget is found, and what its "
            "interval covers: posbench/report/matched.py.\n\n" + "\n".join(rows) + "\n\n"
            + "".join(f"- {line}\n" for line in verdicts))


def matched_parts(df: pd.DataFrame, target: float | None = None) -> tuple[dict, pd.DataFrame, list[str]]:
    """What matched.csv, .md and .png hold, computed (and refused in one line) before any file is
    written: (:func:`budget_cells`, :func:`matched_table`, :func:`matched_verdict`)."""
    lines = budget_cells(df)  # the runs' block sums read once, for the table and the figure
    table, matched, pool = matched_table(df, target, lines=lines)
    if len({line.setup for line in lines.values()}) > 1:
        return lines, table, setup_verdicts(lines, table, matched, pool)
    return lines, table, matched_verdict(matched, pool, float(table.target.iloc[0]))


def write_matched(df: pd.DataFrame, out: Path, target: float | None = None,
                  parts: tuple[dict, pd.DataFrame, list[str]] | None = None) -> list[Path]:
    """matched.csv and matched.md in ``out`` (``parts``: :func:`matched_parts`, computed already)."""
    lines, table, verdicts = parts or matched_parts(df, target)
    files = [out / "matched.csv", out / "matched.md"]
    atomic_write_text(files[0], table.to_csv(index=False))
    across = target is None and len({line.setup for line in lines.values()}) > 1
    atomic_write_text(files[1], matched_markdown(table, verdicts, across))
    return files + matched_figure(lines, table, out / "matched.png")


def matched_figure(lines: dict, table: pd.DataFrame, path: Path) -> list[Path]:
    """Two panels against the training tokens (log x): each line's ppl at train_len with the
    target, and its 16x ratio (log y) with the matched value and its interval where it has one;
    ``lines``: :func:`budget_cells`."""
    from .figures import _pyplot, save

    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, r in enumerate(table.itertuples()):
        budgets = lines[r.label].budgets
        steps = sorted(budgets)
        x = [budgets[s][2] for s in steps]
        colour = f"C{i % 10}"
        left.plot(x, [math.exp(budgets[s][0].mean) for s in steps], "o-", color=colour, label=f"{r.label} ({r.seeds})")
        right.plot(x, [math.exp(budgets[s][1].mean) for s in steps], "o-", color=colour, alpha=0.5)
        if not r.note:
            left.plot([r.matched_tokens], [r.target], "D", color=colour, mfc="white", ms=8)
            err = [[r.ratio - r.ratio_ci_low], [r.ratio_ci_high - r.ratio]]
            right.errorbar([r.matched_tokens], [r.ratio], yerr=err, fmt="D", color=colour, mfc="white", ms=8, capsize=3)
    for goal in sorted(set(table.target)):
        left.axhline(float(goal), color="grey", ls="--", lw=1)
    one = table.target.nunique() == 1
    left.set(xscale="log", xlabel="training tokens", ylabel="ppl at train_len",
             title=f"in distribution; dashed: the target {float(table.target.iloc[0]):.2f}" if one else
             "in distribution; dashed: each label's target")
    right.set(xscale="log", yscale="log", xlabel="training tokens", ylabel="ppl(16x) / ppl(1x)",
              title="16x ratio; diamonds: at the matched budget (95%)")
    left.legend(title="line (seeds)", fontsize=8)
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return save(fig, path, also_svg=True)
