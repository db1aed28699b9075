"""Verdicts: the comparisons a report states, generated from its numbers, one line each.

A results README says what a study found; posbench makes every such sentence a line the report
writes from the runs (report.md's ``## Verdicts``), so a reader can recompute it and a README can
only quote it (``tests/test_verdicts.py`` re-derives every quoted line). Three kinds:

* **orderings**, per setup (lines of one model, text, train_len and split): the lines sorted by
  ppl(L) / ppl(train_len) at the longest length every line reached (where one cannot run past
  train_len, a learned table, at the longest that two or more reached, naming those left out as
  n/a), and by ppl at train_len;
  between two neighbours ``<`` where the 95% interval of the ratio of their values lies below 1,
  ``~`` where it holds 1 ("cannot be told apart"). A symbol compares its two neighbours only: in
  ``a ~ b ~ c``, a and c may still be apart.
* **contrasts** a study declares (``report.contrasts`` of conf/study/*.yaml, ``posbench report
  --contrast A/B``): line A's ratio over line B's, with its interval, "below", "above" or "cannot
  be told apart", in every setup that has both.
* **across setups** (more than one model size or text): for each column that varies (model, data),
  over the setups that differ in it alone, and then over every setup: each pair of lines present
  in all of them whose ratio order is decided in every one either holds (the same order
  everywhere) or changes (opposite orders somewhere); pairs undecided somewhere are counted, not
  listed.

``per`` (``posbench report --per KEY``, KEY one of ``--by``'s keys) makes the key's value part of
the setup instead of the line: a budget study's lines ``alibi [steps=488]`` .. ``alibi
[steps=4883]`` are ordered within each budget (``[steps=488] ppl(L=2048) / ...: alibi ... <
rope ...``), and the across-setups lines say which orders hold at every budget and which change.
A line's name there is its label without that key (``alibi``; ``t5 [bias_scale=none]``).

Intervals are the report's (:mod:`posbench.intervals`): a difference of two lines' log ratios, each
a paired per-seed log ratio with its text resampled alike, with the seeds' term pooled as the
table's (a line below 3 seeds takes at least its column's pooled variance).
"""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pandas as pd

from ..errors import PosbenchError
from ..eval.results import LINE, label_parts
from ..intervals import Cell, Estimator, Interval

SETUP = [c for c in LINE if c != "label"]  # one setup: lines compared with each other
PREFIX = "verdict: "


def ratio_cell(far: Cell, base: Cell) -> Cell:
    """A line's per-seed log ratio log ppl(far) - log ppl(base) as a cell (paired by seed, the text's
    blocks differenced so the bootstrap resamples both lengths alike)."""
    common, ia, ib = np.intersect1d(far.seeds, base.seeds, return_indices=True)
    blocks = None
    if far.blocks is not None and base.blocks is not None and far.tokens_id == base.tokens_id \
            and np.array_equal(far.sizes, base.sizes):
        blocks = far.blocks[ia] - base.blocks[ib]
    return Cell(common, far.nll[ia] - base.nll[ib], blocks, far.sizes if blocks is not None else None,
                far.tokens_id if blocks is not None else ())


def _short(value) -> str:
    """A setup value as a line's name shows it: a mixed text's data label without its bracket."""
    return str(value).split(" [")[0]


def _setup_text(keys: dict, varied: list[str]) -> str:
    return "[" + ", ".join(f"{c}={_short(keys[c])}" for c in varied) + "] " if varied else ""


def _decided(iv: Interval) -> str:
    """'<' where the interval lies below 0 (log scale), '>' above, '~' where it holds 0 or is missing."""
    if math.isnan(iv.low):
        return "~"
    return "<" if iv.high < 0 else ">" if iv.low > 0 else "~"


def ordering(est: Estimator, cells: dict[str, Cell], values: dict[str, float], pool, digits: int) -> str:
    """'a 0.950 < b 0.959 ~ c 4.276': the lines by value, lowest first, each neighbour pair's symbol
    from the interval of their difference (the seeds' term pooled with ``pool``)."""
    names = sorted(cells, key=lambda n: values[n])
    out = f"{names[0]} {values[names[0]]:.{digits}f}"
    for a, b in zip(names, names[1:]):
        sign = _decided(est.difference(cells[a], cells[b], pools=(pool, pool)))
        out += f" {'<' if sign == '<' else '~'} {b} {values[b]:.{digits}f}"
    return out


def split_variant(label: str, key: str) -> tuple[str, str | None]:
    """'alibi [steps=488, bias_scale=none]', 'steps' -> ('alibi [bias_scale=none]', '488'): the label
    without ``key``'s ``k=v`` (:func:`posbench.eval.results.label_parts`), and its value (None where
    the label has none)."""
    base, pairs, tail = label_parts(label)
    if pairs is None:
        return label, None
    value = next((kv[1] for kv in pairs if len(kv) == 2 and kv[0] == key), None)
    rest = ["=".join(kv) for kv in pairs if not (len(kv) == 2 and kv[0] == key)]
    return (f"{base} [{', '.join(rest)}]" if rest else base) + tail, value


def per_split(labels: pd.Series, key: str) -> tuple[pd.Series, pd.Series]:
    """Each label without the dotted ``--per`` key's ``k=v`` (``train.steps``: ``steps=``), and the
    key's value (None where a label has none): :func:`split_variant` over a column."""
    short = key.rsplit(".", 1)[-1]
    split = labels.map(lambda label: split_variant(label, short))
    return split.str[0], split.str[1]


def common_longest(g: pd.DataFrame) -> int | None:
    """The longest eval length past train_len every line (label) of ``g`` reached with a ratio; None
    where some line reaches past train_len and not every one does, rather than a shorter length
    every line has (:meth:`Verdicts._longest_most` then picks one and names the lines left out); the longest below
    train_len only where no line runs past it."""
    tlen = int(g.train_len.iloc[0])
    reached = [set(e[e.ratio_mean.notna()].eval_len) for _, e in g.groupby("label")]
    common = set.intersection(*reached) - {tlen} if reached else set()
    past = {x for x in common if x > tlen}
    if past:
        return max(past)
    if any(x > tlen for r in reached for x in r):
        return None
    return max(common) if common else None


def numeric_first(values: pd.Series) -> pd.Series:
    """A per-key column's values as numbers where every one reads as one (budgets sort 122 < 488 <
    1221), else as text."""
    numbers = pd.to_numeric(values, errors="coerce")
    return numbers if numbers.notna().all() else values.astype(str)


class Verdicts:
    """The verdict lines of one summary (:func:`posbench.report.tables.summarize` with ``cells=True``);
    ``per``: dotted ``--by`` keys whose values split setups instead of lines (module docstring)."""

    def __init__(self, summary: pd.DataFrame, estimator: Estimator | None = None, per: list[str] = ()):
        s = summary[summary.cell.map(lambda c: c.nll.size > 0)]
        self.setup = list(SETUP)
        for key in per:
            short = key.rsplit(".", 1)[-1]
            names, values = per_split(s.label, key)
            s = s.assign(label=names, **{short: numeric_first(values.fillna("unset"))})
            self.setup.append(short)
        self.s = s
        self.est = estimator or Estimator()
        self.varied = [c for c in self.setup if c in self.s and self.s[c].astype(str).nunique() > 1]

    def setups(self):
        for keys, g in self.s.groupby(self.setup, dropna=False, sort=True):
            yield dict(zip(self.setup, keys)), g

    def _longest_most(self, g: pd.DataFrame) -> tuple[int | None, list[str]]:
        """The longest eval length past train_len that at least two lines reached, and the lines
        that did not reach it."""
        tlen = int(g.train_len.iloc[0])
        reached = {label: set(e[e.ratio_mean.notna()].eval_len) - {tlen} for label, e in g.groupby("label")}
        lengths = sorted({x for r in reached.values() for x in r}, key=lambda x: (x > tlen, x), reverse=True)
        for length in lengths:
            having = [label for label, r in reached.items() if length in r]
            if len(having) >= 2:
                return length, sorted(label for label in reached if label not in having)
        return None, []

    def _ratios(self, g: pd.DataFrame, length: int) -> dict[str, Cell]:
        tlen = int(g.train_len.iloc[0])
        cells = {}
        for label, e in g.groupby("label", sort=False):
            e = e.set_index("eval_len")
            cells[label] = ratio_cell(e.cell[length], e.cell[tlen])
        return cells

    @staticmethod
    def _pool(g: pd.DataFrame, length: int, ratio: bool):
        """The seeds' pooled variance of the column (text, train_len, ``length``) that the table's
        intervals used (:func:`posbench.report.tables.add_intervals`), of the cells or the ratios."""
        return g[g.eval_len == length]["ratio_pool" if ratio else "cell_pool"].iloc[0]

    def _order(self, cells: dict[str, Cell], values: dict[str, float], pool, digits: int, g: pd.DataFrame) -> str:
        return ordering(self.est, cells, values, pool, digits) + self._one_seed(g, cells)

    @staticmethod
    def _one_seed(g: pd.DataFrame, names) -> str:
        """' (one seed: a, b; ...)' where trained lines among ``names`` have one seed: their intervals hold the
        text's variation alone, so a symbol beside them says nothing of the seeds' (a pretrained model is one
        model, and says nothing of it)."""
        if "trained" not in g:
            return ""
        one = sorted({r.label for r in g.itertuples() if r.label in names and r.trained and r.seeds == 1})
        if not one:
            return ""
        who = "every line" if len(one) == len(set(names)) else ", ".join(one)
        return f" (one seed: {who}; the seeds' spread is not in their intervals)"

    def orderings(self) -> list[str]:
        lines = []
        for setup, g in self.setups():
            if g.label.nunique() < 2:
                continue
            tlen, where = int(setup["train_len"]), _setup_text(setup, self.varied)
            length, missing = common_longest(g), []
            if length is None:  # a line that cannot run past train_len (a learned table): order the others
                length, missing = self._longest_most(g)
            if length is not None:
                cells = self._ratios(g[~g.label.isin(missing)], length)
                values = {n: math.exp(c.mean) for n, c in cells.items()}
                without = f" (n/a: {', '.join(missing)})" if missing else ""
                lines.append(f"{where}ppl(L={length}) / ppl(L={tlen}) ({length / tlen:g}x), lowest first{without}: "
                             + self._order(cells, values, self._pool(g, length, True), 3, g))
            at = g[g.eval_len == tlen].set_index("label")
            if len(at) > 1:
                cells = dict(at.cell)
                values = {n: math.exp(c.mean) for n, c in cells.items()}
                lines.append(f"{where}ppl(L={tlen}), lowest first: "
                             + self._order(cells, values, self._pool(g, tlen, False), 2, g))
        return lines

    def contrasts(self, pairs) -> list[str]:
        """``pairs``: (A, B) tuples, or 'A/B' texts (:func:`split_contrast`). A line that is not in
        the report is 'no setup has both lines' (a study reported before all its runs exist);
        :func:`verdict_lines` refuses one typed by hand (``strict``)."""
        lines = []
        labels = set(self.s.label)
        for pair in pairs:
            a, b = split_contrast(pair, labels) if isinstance(pair, str) else pair
            found = False
            for setup, g in self.setups():
                if not {a, b} <= set(g.label):
                    continue
                found = True
                length = common_longest(g[g.label.isin([a, b])])
                if length is None:
                    continue
                cells = self._ratios(g[g.label.isin([a, b])], length)
                iv = self.est.difference(cells[a], cells[b], pools=(self._pool(g, length, True),) * 2)
                word = {"<": "below", ">": "above", "~": "cannot be told apart"}[_decided(iv)]
                ci = "[no interval]" if math.isnan(iv.low) else f"[{math.exp(iv.low):.3f}, {math.exp(iv.high):.3f}]"
                tlen = int(setup["train_len"])
                lines.append(f"{_setup_text(setup, self.varied)}{a} / {b}, ppl(L={length}) / ppl(L={tlen}): "
                             f"{math.exp(iv.estimate):.3f} {ci}: {word}" + self._one_seed(g, (a, b)))
            if not found:
                lines.append(f"{a} / {b}: no setup has both lines")
        return lines

    def _signs(self) -> list[tuple[dict, dict[tuple[str, str], str]]]:
        """Per setup with a common longest length: the decided order ('<', '>', '~') of each pair of lines."""
        out = []
        for setup, g in self.setups():
            length = common_longest(g)
            if length is None:
                continue
            cells, pool = self._ratios(g, length), self._pool(g, length, True)
            out.append((setup, {(a, b): _decided(self.est.difference(cells[a], cells[b], pools=(pool, pool)))
                                for a, b in combinations(sorted(cells), 2)}))
        return out

    @staticmethod
    def _agreement(found: list[dict[tuple[str, str], str]], what: str) -> list[str]:
        """Over the setups ``found``: pairs decided alike in every one (holds), decided oppositely
        (changes), and a count of pairs in every setup left undecided in some."""
        holds, changes, undecided = [], [], 0
        pairs = set.intersection(*(set(f) for f in found))
        for a, b in sorted(pairs):
            signs = [f[(a, b)] for f in found]
            if "~" in signs:
                undecided += 1
            elif len(set(signs)) == 1:
                holds.append(f"{a} < {b}" if signs[0] == "<" else f"{b} < {a}")
            else:
                changes.append(f"{a} vs {b} ({' / '.join(signs)})")
        return [f"{what}, the ratio order that holds in every one: " + ("; ".join(holds) or "none"),
                f"{what}, the ratio order that changes: " + ("; ".join(changes) or "none"),
                f"{what}: {undecided} pair(s) of lines in every one cannot be told apart in at least one"]

    def across(self) -> list[str]:
        """For each varied setup column (model, data, ...), over the setups that differ in it alone;
        then, with several varied columns, over every setup."""
        signs = self._signs()
        lines = []
        for col in self.varied:
            others = [c for c in self.varied if c != col]
            groups: dict[tuple, list] = {}
            for setup, found in signs:
                groups.setdefault(tuple(_short(setup[c]) for c in others), []).append((setup, found))
            for key, group in groups.items():
                if len(group) < 2:
                    continue
                values = "/".join(_short(setup[col]) for setup, _ in group)
                at = "".join(f", {c}={v}" for c, v in zip(others, key))
                lines += self._agreement([f for _, f in group], f"across {col} ({values}{at})")
        if len(self.varied) > 1 and len(signs) > 1:
            lines += self._agreement([f for _, f in signs], f"across all {len(signs)} setups")
        return lines


def check_contrast(a: str, b: str, labels: set[str]) -> None:
    """One line where ``a`` or ``b`` is not a line of the report (``--contrast`` typed by hand)."""
    unknown = [x for x in (a, b) if x not in labels]
    if unknown:
        raise PosbenchError(f"report: --contrast {a}/{b}: {unknown[0]!r} is not a line of this report; valid: "
                            + ", ".join(sorted(labels)))


def split_contrast(text: str, labels: set[str]) -> tuple[str, str]:
    """'A/B' -> (A, B), cut at the '/' where both sides name lines of ``labels`` (a line name may
    hold a '/' itself: 'alibi sliding/16', a ``--by dir`` path), else at the first '/'."""
    for i, char in enumerate(text):
        if char == "/" and text[:i] in labels and text[i + 1:] in labels:
            return text[:i], text[i + 1:]
    a, _, b = text.partition("/")
    return a, b


#: A line whose ppl at train_len is at least this fraction of the unigram perplexity of its text
#: (``unigram_ppl``: :func:`posbench.eval.ladder.unigram_perplexity`) learned little beyond how often
#: each token occurs: its ratios say nothing of extrapolation, so it gets no verdict. experiment=smoke
#: lands at 0.9 (335 against 374 on sotu's 1,024-token vocabulary); cpu_quick's lines at 0.4-0.5.
UNTRAINED = 0.8


def verdict_lines(summary: pd.DataFrame, contrasts=(), estimator: Estimator | None = None,
                  per: list[str] = (), strict: bool = False, untrained: dict | None = None) -> list[str]:
    """Every verdict of ``summary`` (module docstring), each a line starting with :data:`PREFIX`;
    ``strict``: a contrast naming no line of the report is refused (:meth:`Verdicts.contrasts`);
    ``untrained``: lines (keyed by :data:`~posbench.eval.results.LINE`) that learned too little to
    compare (:func:`posbench.report.tables.untrained_lines`), left out of every verdict and named.
    A contrast is checked against every line of the report, the untrained ones included."""
    labels = set(summary.label)
    for pair in contrasts if strict else ():
        check_contrast(*(split_contrast(pair, labels) if isinstance(pair, str) else pair), labels)
    out = np.array([tuple(r) in (untrained or {}) for r in summary[LINE].itertuples(index=False)], dtype=bool)
    left = sorted(set(summary.label[out]))
    named = [f"not compared, having learned little beyond token frequencies (ppl at train_len at least "
             f"{100 * UNTRAINED:.0f}% of the unigram perplexity): {', '.join(left)}"] if left else []
    kept = summary[~out]
    if kept.empty:
        return [PREFIX + line for line in named]
    v = Verdicts(kept, estimator, per)
    return [PREFIX + line for line in named + v.orderings() + v.contrasts(contrasts) + v.across()]



def verdicts_markdown(lines: list[str]) -> str:
    if not lines:
        return ""
    return ("\n## Verdicts\n\nGenerated from the table's runs (posbench/report/verdicts.py): `<` where the 95% "
            "interval of the ratio of two neighbours' values lies below 1, `~` where it holds 1 (cannot be told "
            "apart; each symbol compares its two neighbours only).\n\n" + "".join(f"- {line}\n" for line in lines))
