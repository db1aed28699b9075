"""95% intervals for perplexities and their ratios, covering both the seeds' and the text's variation.

Everything is computed on the log scale, the mean NLL per token (ln ppl), where a perplexity is
an average and a ratio of perplexities a difference; intervals are exponentiated at the end. A
cell's point estimate is the mean over seeds of their mean NLLs (the geometric mean of their
perplexities), and every interval is built around it: estimate ± q sqrt(v), so the estimate is
always inside (the percentile bootstrap used before could leave it outside).

Two things vary between what a table shows and what a reader wants to know: the model (another
seed trains another model) and the text (another sample of text like the validation split scores
differently). An interval covers both; v is the sum of

* **the seeds' variance** of the mean, s² / k over k seeds' mean NLLs x_1 .. x_k,
  s² = sum (x_i - mean(x))² / (k - 1) (for a ratio of one line, ppl(L) / ppl(train_len): over the
  per-seed differences d_i = x_i(L) - x_i(train_len), since the same models score both lengths;
  for two lines, no seeds in common: s_a² / k_a + s_b² / k_b, Welch); and
* **the text's variance**: the variance of the estimate over a block bootstrap of the scored
  tokens (below), the same resamples for both sides of a difference, so text that is hard for both
  cancels.

q is Student's t at the Welch-Satterthwaite degrees of freedom, (sum v)² / sum (v_j² / df_j),
with df_j = k_j - 1 for a seed term and BLOCKS - 1 for the text term (its variance estimated from
BLOCKS blocks, and corrected by BLOCKS / (BLOCKS - 1) for the bootstrap's divisor): with 2 seeds
whose spread dominates, q is near t_1 = 12.7 and the interval honestly wide; where the text
dominates, q is near t_19 = 2.09. :func:`combined_interval`.

**A seed term two seeds cannot hide** (:func:`seed_term`, :func:`pool_seeds`). Two seeds give
their variance one degree of freedom: a chi-square with 1 df falls below a tenth of its mean a
quarter of the time, so two seeds that agree by chance would make the text term dominate, the df
grow and q fall toward 1.96 - an interval far narrower than the line's true seed spread. A report
therefore pools the seeds' variance on the log scale across its lines at one column (one text,
train_len and eval_len; for a ratio, the variances of the per-seed differences), s_p² = sum
(k_i - 1) s_i² / sum (k_i - 1) with df_p = sum (k_i - 1), and a line of fewer than
:data:`MIN_SEEDS` seeds uses the larger of s_p² (at df_p) and its own s² (at k - 1). A line of 3
or more seeds keeps its own: pooling across encodings whose seed spreads differ by orders of
magnitude (ALiBi's and NoPE's at 16x) would widen the stable lines for the unstable ones' sake,
and from 3 seeds the line's own estimate already covers (below). The pooled term assumes the
lines of a column vary alike across seeds; where they do not, a two-seed line of a stable
encoding gets the wider interval, which is what two seeds can honestly say of it.
``scripts/interval_coverage.py`` measures the coverage by simulation at the headline's
seed-to-text variance ratio (results/intervals/coverage.md); ``tests/test_intervals.py`` keeps a
cheap version of it.
``ci_method`` names what a row's interval holds: ``seeds+text``; ``text (1 seed)`` where a line
has one seed (its seeds' spread is unknown, so the interval covers the text only, and figures
mark those cells); ``t`` for runs without per-token
NLL (the seeds only); ``none``.

**The block bootstrap of the text**: every length of every run scores the same tokens 1 .. n of
the split (:mod:`posbench.eval.ladder`), so all cells share one sample of text. The n scored tokens
are cut into :data:`BLOCKS` contiguous blocks of n / BLOCKS tokens (rounded); a resample draws
BLOCKS block indices with replacement, and a cell's resampled mean NLL is

    sum over drawn blocks of NLL sums / sum over drawn blocks of token counts,

averaged over the cell's seeds. The same :data:`RESAMPLES` x n_blocks index matrix serves every
cell with the same blocks: a ratio's numerator and denominator (and every column of a table)
see the same resampled text. Blocks, not tokens: the losses of neighbouring tokens are correlated
(one window's context, one document's topic and style), and resampling single tokens would treat
them as independent and give a variance too small. The dependence reaches across whole documents,
so the blocks are as long as the bootstrap allows (20); ``docs/evaluation.md`` shows the
measurements behind that choice.

**Scores over instances** (the algorithmic tasks, :mod:`posbench.report.tasks`): a proportion of
k successes in n instances gets the Wilson score interval (:func:`wilson_interval`); per-instance
scores summarized by each run's mean, sd and count are pooled into the mean and sd of the union
of their instances (:func:`pooled_moments`) and get a t interval over those instances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

LEVEL = 0.95
MIN_SEEDS = 3  # from 3 seeds (2 df) a line's own seed variance is used; below, at least the pooled one
# (seed_term), and the task report's t over seeds (posbench.report.tasks) needs this many
BLOCKS = 20  # bootstrap resampling units: contiguous blocks of n / BLOCKS scored tokens (docs/evaluation.md)
RESAMPLES = 2000  # percentile-interval resamples: Monte Carlo error of a 2.5% quantile ~ 0.4%-points


# ---------------------------------------------------------------- Student's t
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz, Numerical Recipes 6.4)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom: 1 - I_{df/(df+t²)}(df/2, 1/2) / 2 for t >= 0."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


@lru_cache(maxsize=1024)
def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t (bisection on :func:`t_cdf`; df may be fractional, as in Welch's)."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


class Interval(NamedTuple):
    """An estimate on the log scale (mean NLL, or a difference of mean NLLs) and its 95% interval;
    where it is Student's t (:func:`combined_interval`), also its standard error and degrees of
    freedom, from which :func:`p_value` gives the test the interval inverts."""
    estimate: float
    low: float
    high: float
    method: str  # 'seeds+text', 'text (1 seed)', 't', 'welch', 'wilson', 'pooled t', or 'none' (low = high = NaN)
    se: float = math.nan
    df: float = math.nan


def p_value(iv: Interval) -> float:
    """The two-sided p-value of 'the estimate is 0' that ``iv`` inverts: 2 P(T > |estimate| / se) at
    its df (the normal at infinite df), so p < 1 - level exactly where the interval excludes 0. NaN
    where the interval has no standard error (none, or not a t interval); 0 for a nonzero estimate
    of zero standard error, 1 for a zero one."""
    if math.isnan(iv.se) or math.isnan(iv.df):
        return math.nan
    if iv.se == 0:
        return 1.0 if iv.estimate == 0 else 0.0
    t = abs(iv.estimate) / iv.se
    upper = 1.0 - NormalDist().cdf(t) if iv.df >= 1e4 else 1.0 - t_cdf(t, iv.df)
    return min(1.0, 2.0 * upper)


NONE = "none"


def t_interval(x, level: float = LEVEL) -> Interval:
    """mean(x) ± t_{(1+level)/2, k-1} s / sqrt(k)."""
    x = np.asarray(x, dtype=float)
    k, mean = x.size, float(np.mean(x))
    half = t_quantile((1 + level) / 2, k - 1) * float(np.std(x, ddof=1)) / math.sqrt(k)
    return Interval(mean, mean - half, mean + half, "t")


def welch_interval(a, b, level: float = LEVEL) -> Interval:
    """mean(a) - mean(b) ± t_{(1+level)/2, df} sqrt(s_a²/k_a + s_b²/k_b), with the
    Welch-Satterthwaite df = (v_a + v_b)² / (v_a²/(k_a-1) + v_b²/(k_b-1)), v = s²/k."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    va, vb = np.var(a, ddof=1) / a.size, np.var(b, ddof=1) / b.size
    diff = float(a.mean() - b.mean())
    if va + vb == 0:
        return Interval(diff, diff, diff, "welch")
    df = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    half = t_quantile((1 + level) / 2, df) * math.sqrt(va + vb)
    return Interval(diff, diff - half, diff + half, "welch")


# ---------------------------------------------------------------- scores over instances
def wilson_interval(successes: float, n: float, level: float = LEVEL) -> Interval:
    """The Wilson score interval of a proportion p = successes / n (Wilson 1927):

        (p + z²/2n ± z sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n),     z = the (1+level)/2 normal quantile.

    Stays inside [0, 1] and keeps a width at p = 0 or 1, where the normal approximation has none.
    The estimate is p itself, not the interval's centre."""
    if not n > 0:
        return Interval(math.nan, math.nan, math.nan, NONE)
    p, z = successes / n, NormalDist().inv_cdf((1 + level) / 2)
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    scale = 1 + z * z / n
    low = 0.0 if p <= 0 else max(0.0, (centre - half) / scale)  # exactly 0 and 1 at the ends, not round-off
    high = 1.0 if p >= 1 else min(1.0, (centre + half) / scale)
    return Interval(p, low, high, "wilson")


def pooled_moments(means, sds, counts) -> tuple[float, float, int]:
    """(mean, sd with ddof=1, N) of the union of groups known only by their means m_i, sds s_i
    (ddof=1) and counts n_i, exactly:

        N = sum n_i,   m = sum n_i m_i / N,   s² = (sum (n_i - 1) s_i² + sum n_i (m_i - m)²) / (N - 1).

    A group of one instance has no sd and adds only its mean (its (n_i - 1) s_i² is 0)."""
    m_i, n_i = np.asarray(means, dtype=float), np.asarray(counts, dtype=float)
    s_i = np.asarray(sds, dtype=float)
    total = float(n_i.sum())
    if not total > 0:
        return math.nan, math.nan, 0
    mean = float((n_i * m_i).sum() / total)
    within = np.where(n_i > 1, (n_i - 1) * s_i ** 2, 0.0)
    var = (within.sum() + (n_i * (m_i - mean) ** 2).sum()) / (total - 1) if total > 1 else math.nan
    return mean, math.sqrt(var) if var == var else math.nan, int(total)


def pooled_t_interval(means, sds, counts, level: float = LEVEL) -> Interval:
    """m ± t_{(1+level)/2, N-1} s / sqrt(N) over the union of the groups' instances
    (:func:`pooled_moments`); no interval for fewer than 2 instances or an unknown sd."""
    mean, sd, total = pooled_moments(means, sds, counts)
    if total < 2 or math.isnan(sd):
        return Interval(mean, math.nan, math.nan, NONE)
    half = t_quantile((1 + level) / 2, total - 1) * sd / math.sqrt(total)
    return Interval(mean, mean - half, mean + half, "pooled t")


# ---------------------------------------------------------------- block bootstrap
def block_sums(token_nll: np.ndarray, blocks: int = BLOCKS) -> tuple[np.ndarray, np.ndarray]:
    """(NLL sum, tokens) of each of ``blocks`` contiguous blocks of the scored tokens, block k
    holding tokens round(k n / blocks) .. round((k + 1) n / blocks) - 1 (sizes differ by at most 1)."""
    x = np.asarray(token_nll, dtype=np.float64)
    starts = np.unique(np.round(np.linspace(0, x.size, min(blocks, x.size) + 1)).astype(np.int64))
    return np.add.reduceat(x, starts[:-1]), np.diff(starts)


def resample_indices(n_blocks: int, resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """(resamples, n_blocks) block indices drawn with replacement; the same for the same arguments,
    so every cell with the same blocks is resampled alike (paired)."""
    return np.random.default_rng([seed, n_blocks]).integers(0, n_blocks, size=(resamples, n_blocks))


def bootstrap_means(sums: np.ndarray, sizes: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Mean NLL of each resample: sums (..., n_blocks) -> (..., resamples)."""
    return sums[..., index].sum(-1) / sizes[index].sum(-1)


def percentile_interval(estimate: float, samples: np.ndarray, level: float = LEVEL) -> Interval:
    low, high = np.quantile(samples, [(1 - level) / 2, (1 + level) / 2])
    return Interval(estimate, float(low), float(high), "bootstrap")


# ---------------------------------------------------------------- the seeds' term
class SeedPool(NamedTuple):
    """The seeds' variance pooled over the lines of one report column (log scale, per seed) and its df."""
    var: float
    df: float


def pool_seeds(groups) -> SeedPool | None:
    """s_p² = sum (k_i - 1) s_i² / sum (k_i - 1), df = sum (k_i - 1), over the per-seed values of
    each line (lines of one seed add nothing); None where no line has 2 seeds."""
    ss = df = 0.0
    for x in groups:
        x = np.asarray(x, dtype=float)
        if x.size >= 2:
            ss += float(np.var(x, ddof=1)) * (x.size - 1)
            df += x.size - 1
    return SeedPool(ss / df, df) if df else None


def seed_term(x, pool: SeedPool | None = None) -> list[tuple[float, float]]:
    """[(variance of the mean over a line's seeds, its df)] for the per-seed values ``x`` (none for
    one seed): s² / k at k - 1 df, or, below :data:`MIN_SEEDS` seeds, s_p² / k at df_p where the
    pooled variance is the larger (module docstring)."""
    x = np.asarray(x, dtype=float)
    k = x.size
    if k < 2:
        return []
    own = float(np.var(x, ddof=1))
    if k < MIN_SEEDS and pool is not None and pool.var > own:
        return [(pool.var / k, pool.df)]
    return [(own / k, k - 1)]


# ---------------------------------------------------------------- cells and their comparisons
@dataclass
class Cell:
    """One table cell, a line at one eval length: each seed's mean NLL and, where every seed's run
    kept them, its block sums (seeds, n_blocks) over the scored tokens ``tokens_id`` names
    (data, split, n): cells bootstrap together only when they scored the same tokens."""
    seeds: np.ndarray
    nll: np.ndarray
    blocks: np.ndarray | None = None
    sizes: np.ndarray | None = None
    tokens_id: tuple = ()

    @property
    def mean(self) -> float:
        return float(np.mean(self.nll)) if self.nll.size else math.nan

    def same_tokens(self, other: Cell) -> bool:
        """Both cells kept block sums over the same scored tokens in the same blocks, so their text
        terms bootstrap together (paired)."""
        return (self.blocks is not None and other.blocks is not None and self.tokens_id == other.tokens_id
                and np.array_equal(self.sizes, other.sizes))

    def only(self, index: np.ndarray) -> Cell:
        """The cell restricted to the seeds at ``index``."""
        return Cell(self.seeds[index], self.nll[index], None if self.blocks is None else self.blocks[index],
                    self.sizes, self.tokens_id)


class Estimator:
    """Intervals of cells and of their differences that carry both sources of variation, the
    seeds' spread and the text's (module docstring); one bootstrap index matrix per block count."""

    def __init__(self, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0):
        self.level, self.resamples, self.seed = level, resamples, seed
        self._index: dict[int, np.ndarray] = {}

    def _boot(self, cell: Cell) -> np.ndarray:
        """(resamples,) resampled mean NLL, averaged over the cell's seeds."""
        nb = cell.sizes.size
        if nb not in self._index:
            self._index[nb] = resample_indices(nb, self.resamples, self.seed)
        return bootstrap_means(cell.blocks, cell.sizes, self._index[nb]).mean(0)

    def cell(self, c: Cell, pool: SeedPool | None = None) -> Interval:
        """Mean NLL over seeds: seeds and text where the runs kept their per-token NLL, the seeds'
        t alone where not; one seed: the text alone ("text (1 seed)"). ``pool``: the seeds'
        variance pooled over the column's lines (:func:`seed_term`)."""
        k = c.nll.size
        if not k:
            return Interval(math.nan, math.nan, math.nan, NONE)
        text = self._boot(c) if c.blocks is not None else None
        return combined_interval(c.mean, seed_term(c.nll, pool), text, self.level, k == 1,
                                 None if text is None else c.sizes.size)

    def difference(self, a: Cell, b: Cell, same_models: bool = False,
                   pools: tuple[SeedPool | None, SeedPool | None] = (None, None)) -> Interval:
        """mean NLL(a) - mean NLL(b), the log of ppl(a) / ppl(b). ``same_models``: a and b are the same
        runs at two lengths (one line), paired by seed (the seeds both have): the variance over
        seeds of the per-seed difference; else two lines, Welch's two variances. Either way plus
        the text's, from the paired bootstrap, when both scored the same tokens. ``pools``: the
        pooled seed variances (:func:`seed_term`) of a and b, or with ``same_models`` the first
        is that of the per-seed differences of the column's lines."""
        if not (a.nll.size and b.nll.size):
            return Interval(math.nan, math.nan, math.nan, NONE)
        if same_models:  # the seeds both cells have, so the estimate and its interval pair the same models
            common, ia, ib = np.intersect1d(a.seeds, b.seeds, return_indices=True)
            if not common.size:
                return Interval(math.nan, math.nan, math.nan, NONE)
            a, b = a.only(ia), b.only(ib)
            seeds = seed_term(a.nll - b.nll, pools[0])
            one = common.size == 1
        else:
            seeds = seed_term(a.nll, pools[0]) + seed_term(b.nll, pools[1])
            one = min(a.nll.size, b.nll.size) == 1
        text = self._boot(a) - self._boot(b) if a.same_tokens(b) else None
        return combined_interval(a.mean - b.mean, seeds, text, self.level, one,
                                 None if text is None else a.sizes.size)


def combined_interval(estimate: float, seeds: list[tuple[float, float]], text: np.ndarray | None,
                      level: float = LEVEL, one_seed: bool = False, blocks: int | None = None) -> Interval:
    """estimate ± q sqrt(sum of the seed variances + the text variance), centred on the estimate.

    ``seeds``: (variance of the mean over seeds, its degrees of freedom) per line (none for a line
    of one seed); ``text``: bootstrap resamples of the estimate over the text's ``blocks`` blocks
    (None: no per-token NLL). The bootstrap's variance of a mean of n blocks is (n - 1) / n of the
    unbiased s² / n, and s² has n - 1 degrees of freedom: the text term is the bootstrap variance
    x n / (n - 1) at n - 1 df (infinite df and no correction where ``blocks`` is None), so that with
    the text alone the interval is Student's t over the blocks (the normal quantile with the
    bootstrap's variance covered 0.929 at 20 blocks, results/intervals/coverage.md). q is
    Student's t at the Welch-Satterthwaite df (sum v)² / sum (v² / df). Method: ``seeds+text``,
    ``text (1 seed)`` (a line of one seed: the seeds' spread is unknown and not in it), ``t`` (seeds
    only: runs without per-token NLL), or ``none``."""
    if text is None and (one_seed or not seeds):
        return Interval(estimate, math.nan, math.nan, NONE)
    method = "text (1 seed)" if one_seed and text is not None else "seeds+text" if text is not None else "t"
    v_seeds = sum(v for v, _ in seeds)
    v_text = float(np.var(text, ddof=1)) if text is not None else 0.0
    text_df = blocks - 1 if text is not None and blocks is not None and blocks > 1 else math.inf
    v_text *= blocks / text_df if text_df < math.inf else 1.0  # n / (n - 1), at df = n - 1
    total = v_seeds + v_text
    if total == 0:
        return Interval(estimate, estimate, estimate, method, 0.0, math.inf)
    terms = [*seeds, (v_text, text_df)]
    denom = sum(v * v / df for v, df in terms if v > 0 and df < math.inf)
    df = total * total / denom if denom > 0 else math.inf
    q = t_quantile((1 + level) / 2, df) if df < 1e4 else NormalDist().inv_cdf((1 + level) / 2)
    half = q * math.sqrt(total)
    return Interval(estimate, estimate - half, estimate + half, method, math.sqrt(total), df)
