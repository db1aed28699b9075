"""LongPPL: perplexity over the key tokens, those an evaluator model predicts well only with a long
context (Fang et al., "What is Wrong with Perplexity for Long-context Language Modeling?", ICLR
2025; reference implementation ``longppl`` 0.3.0, ``find_key_token`` and ``compute_longppl``).

Selection (the paper's long-short difference and long-context likelihood, as ``find_key_token``
writes them), for each scored token t, from the evaluator's NLL with a long context, l_long(t), and
with a short one, l_short(t):

    LSD(t) = l_short(t) - l_long(t)        # long-short difference, nats
    LCL(t) = -l_long(t)                    # long-context log-likelihood
    key(t) = LSD(t) > alpha  and  LCL(t) > beta,   alpha = 2, beta = -2 (:data:`ALPHA`, :data:`BETA`)

and only where the long context holds more tokens than the short one (the reference looks only at
tokens past its ``trunc_len``). LongPPL of an evaluated model is exp(mean NLL of that model over the
key tokens); its ordinary perplexity over the same tokens rides beside it.

No logits are held: both evaluator NLLs are ladder rows whose per-token NLLs token_nll.npz already
stores (:mod:`posbench.eval.token_nll`), and entry t-1 of every row is target t, whatever the length,
protocol or scored count, so rows of the evaluator and of the evaluated runs align token for token
on their common prefix. The context each row gave target t follows from its window and stride
(:func:`context_lengths`):

* long: a non-overlapping row of the evaluator (default: its longest at most its own trained
  context, where it is trusted);
* short: a sliding row of the evaluator at ``eval_len`` W with stride S, which predicts every token
  past the first window from W-S+1 .. W tokens of context. The reference's short windows
  (``trunc_len``, ``sliding_window``) give contexts ``trunc_len`` .. ``trunc_len + sliding_window - 1``:
  the sliding row W = trunc_len + sliding_window - 1, S = sliding_window, token for token. posbench's
  default is W = the evaluated runs' train_len and S = W // 4 (:data:`SHORT_STRIDE_DIVISOR`): the key
  tokens are those that need more context than the evaluated runs trained with, and the short context
  is 3/4 W + 1 .. W (the reference's defaults, 4096 and 1024, give 4096 .. 5119).

The evaluator must tokenize the text as the evaluated runs do (the same corpus and tokenizer):
key tokens are token positions. For trained runs, use a run of the same study trained at a longer
length (say 4x train_len) evaluated at its own train_len; for pretrained models, a longer-context
model of the same tokenizer (Gemma 3 4B, 128k, judging Gemma 3 1B, 32k). An evaluator with another
tokenizer (Gemma 3 judging SmolLM2) would need the reference's character-offset mapping, which is
not done here: :func:`check_same_text` refuses it.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from ..errors import PosbenchError
from .results import KEY, METHOD, as_trained, read_results, with_method
from .token_nll import FILE as TOKEN_NLL
from .token_nll import read_token_nll, row_key

ALPHA = 2.0  # LSD threshold, nats (the reference's alpha)
BETA = -2.0  # LCL threshold, log-probability (the reference's beta)
SHORT_STRIDE_DIVISOR = 4  # default short row: sliding, stride = eval_len // 4
FILE = "longppl.csv"
KEYS = "longppl_keys.npz"  # a study's key tokens, beside its runs/longppl.csv (KeyTokens.save)
COLUMNS = KEY + ["model", "data", "tokens", "key_tokens", "longppl", "ppl", "evaluator", "long_len", "short_len",
                 "short_stride", "alpha", "beta", "config_hash", "nll_blocks", "key_nll_blocks", "key_block_tokens",
                 *METHOD]
BLOCK_COLUMNS = ("nll_blocks", "key_nll_blocks", "key_block_tokens")  # ';'-joined, one value per bootstrap block


def context_lengths(count: int, eval_len: int, stride: int) -> np.ndarray:
    """(count,) tokens of context before targets 1 .. count in windows of ``eval_len`` advancing by
    ``stride`` (= eval_len: non-overlapping), as :func:`posbench.eval.ladder.window_nll` scores them:
    the first window predicts target t from t tokens; window w >= 1 its last ``stride`` targets, t from
    t - w * stride tokens."""
    t = np.arange(1, count + 1, dtype=np.int64)
    window = np.where(t <= eval_len, 0, -((eval_len - t) // stride))  # ceil((t - eval_len) / stride)
    return t - window * stride


def key_tokens(long_nll: np.ndarray, short_nll: np.ndarray, long_context: np.ndarray | None = None,
               short_context: np.ndarray | None = None, alpha: float = ALPHA, beta: float = BETA) -> np.ndarray:
    """(n,) bool: the key tokens (module docstring) of an evaluator's per-token NLLs with a long and a
    short context, over their common prefix; with the context lengths, only tokens whose long context
    is longer. Differences are taken in float32, as the reference takes them."""
    n = min(long_nll.size, short_nll.size)
    long_nll, short_nll = np.asarray(long_nll[:n], np.float32), np.asarray(short_nll[:n], np.float32)
    key = ((short_nll - long_nll) > alpha) & (-long_nll > beta)  # LSD > alpha, LCL > beta
    if long_context is not None and short_context is not None:
        key &= long_context[:n] > short_context[:n]
    return key


def longppl(nll: np.ndarray, key: np.ndarray) -> tuple[float, int]:
    """(exp of the mean of ``nll`` over ``key``, the number of key tokens), on their common prefix;
    NaN where no token is key."""
    n = min(nll.size, key.size)
    chosen = np.asarray(nll[:n], np.float64)[key[:n]]
    return (math.exp(chosen.mean()) if chosen.size else math.nan), int(chosen.size)


@dataclass
class KeyTokens:
    """The key tokens an evaluator chose, and how (the columns of longppl.csv name them)."""

    mask: np.ndarray  # (n,) bool over targets 1 .. n
    evaluator: str
    split: str
    long_len: int
    short_len: int
    short_stride: int
    alpha: float
    beta: float

    def truncated(self, count: int) -> "KeyTokens":
        return KeyTokens(self.mask[:count], self.evaluator, self.split, self.long_len, self.short_len,
                         self.short_stride, self.alpha, self.beta)

    def how(self) -> dict:
        """The selection's columns of longppl.csv (all but the mask)."""
        return {"evaluator": self.evaluator, "long_len": self.long_len, "short_len": self.short_len,
                "short_stride": self.short_stride, "alpha": self.alpha, "beta": self.beta}

    def same_as(self, other: "KeyTokens") -> bool:
        """The same tokens chosen the same way."""
        return (self.how(), self.split) == (other.how(), other.split) and np.array_equal(self.mask, other.mask)

    def chosen_in(self, run: str | Path) -> bool:
        """Whether ``run`` holds, with their per-token NLLs, the two unscaled rows these key tokens
        were chosen from: its non-overlapping row at ``long_len`` and its sliding row at
        ``short_len`` with ``short_stride``. A folder made again on a fresh machine that evaluates
        other lengths does not, and the saved key tokens stand for it."""
        if not (Path(run) / "results.csv").is_file():
            return False
        long, short = _long_short(_scored_rows(Path(run), self.split)[0], self.long_len, self.short_len,
                                  self.short_stride)
        return not long.empty and not short.empty

    def agrees(self, spec: dict) -> bool:
        """Whether a study's ``report.longppl`` options (short, short_stride, long, alpha, beta; those
        it states) are those these key tokens were chosen with."""
        mine = {"short": self.short_len, "short_stride": self.short_stride, "long": self.long_len,
                "alpha": self.alpha, "beta": self.beta}
        return all(spec[k] is None or float(spec[k]) == float(v) for k, v in mine.items() if k in spec)

    def save(self, path: Path) -> None:
        """Write the selection to ``path`` (npz: the mask as bits, a few KiB for 10^5 tokens, and
        how it was chosen), so rows can be added on the same key tokens once the evaluator's
        per-token NLLs are gone (:func:`load_keys`)."""
        from ..runs.rundir import atomic_write

        how = json.dumps({**self.how(), "split": self.split, "tokens": int(self.mask.size)})
        atomic_write(Path(path), lambda f: np.savez_compressed(f, mask=np.packbits(self.mask), how=np.array(how)))


def load_keys(path: str | Path) -> KeyTokens:
    """The key tokens :meth:`KeyTokens.save` wrote."""
    with np.load(path) as z:
        how = json.loads(str(z["how"]))
        mask = np.unpackbits(z["mask"], count=int(how["tokens"])).astype(bool)
    return KeyTokens(mask, how["evaluator"], how["split"], int(how["long_len"]), int(how["short_len"]),
                     int(how["short_stride"]), float(how["alpha"]), float(how["beta"]))


def _scored_rows(run: Path, split: str) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """A run dir's unscaled-or-not rows of ``split`` with status ok whose per-token NLL is stored."""
    if not (run / "results.csv").is_file():
        raise PosbenchError(f"longppl: {str(run)!r} has no results.csv; valid: a run dir or a pretrained output "
                            "dir that posbench eval wrote")
    rows, stored = read_results(run / "results.csv"), read_token_nll(run / TOKEN_NLL)
    rows = rows[(rows.status == "ok") & (rows.split == split)]
    rows = rows[[row_key(r) in stored for r in rows.to_dict("records")]]
    return rows.reset_index(drop=True), stored


def _config(run: Path) -> dict:
    path = run / "config.yaml"
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True) if path.is_file() else {}


def _long_short(rows: pd.DataFrame, long_len: int | None, short_len: int, short_stride: int
                ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """An evaluator's unscaled rows that key tokens are chosen from: (its non-overlapping rows at
    ``long_len``, none where it is None; its sliding rows at ``short_len`` with ``short_stride``)."""
    rows = rows[as_trained(rows)]
    plain = rows[rows["mode"] == "nonoverlapping"]
    long = plain[plain.eval_len == long_len] if long_len is not None else plain.iloc[:0]
    return long, rows[(rows["mode"] == "sliding") & (rows.eval_len == short_len) & (rows.stride == short_stride)]


def select_key_tokens(evaluator: str | Path, short_len: int, short_stride: int | None = None,
                      long_len: int | None = None, split: str = "validation", alpha: float = ALPHA,
                      beta: float = BETA) -> KeyTokens:
    """The key tokens of the evaluator's run dir (or pretrained output dir): its non-overlapping
    unscaled row at ``long_len`` (default: its longest at most its trained context) against its
    sliding unscaled row at ``short_len`` with stride ``short_stride`` (default short_len // 4)."""
    run = Path(evaluator)
    short_stride = short_stride or max(1, short_len // SHORT_STRIDE_DIVISOR)
    rows, stored = _scored_rows(run, split)
    rows = rows[as_trained(rows)]
    plain = rows[rows["mode"] == "nonoverlapping"]
    if long_len is None:
        trained = _config(run).get("train", {}).get("train_len")
        trusted = plain[plain.eval_len <= int(trained)] if trained else plain
        long_len = int(trusted.eval_len.max()) if len(trusted) else None
    long, short = _long_short(rows, long_len, short_len, short_stride)
    if long.empty:
        raise PosbenchError(f"longppl: the evaluator {str(run)!r} has no non-overlapping row "
                            f"{'at eval_len ' + str(long_len) if long_len else 'at most its trained context'} with "
                            f"per-token NLLs; run: posbench eval checkpoint={run} eval.lengths=[<its train_len>]")
    if short.empty:
        raise PosbenchError(f"longppl: the evaluator {str(run)!r} has no sliding row at eval_len {short_len}, "
                            f"stride {short_stride}; run: posbench eval checkpoint={run} eval.mode=sliding "
                            f"eval.lengths=[{short_len}] eval.stride={short_stride}")
    if short_len >= long_len:
        raise PosbenchError(f"longppl: the short window ({short_len}) must be shorter than the long context "
                            f"({long_len}); valid: --short < --long")
    long_nll, short_nll = stored[row_key(long.iloc[0])], stored[row_key(short.iloc[0])]
    n = min(long_nll.size, short_nll.size)
    mask = key_tokens(long_nll, short_nll, context_lengths(n, long_len, long_len),
                      context_lengths(n, short_len, short_stride), alpha, beta)
    return KeyTokens(mask, str(run), split, int(long_len), int(short_len), int(short_stride), alpha, beta)


def _tokenizer_digest(config: dict) -> str | None:
    """sha256 of a pretrained model's tokenizer.json (None for a trained run or where it is gone)."""
    path = Path(str(config.get("pretrained", {}).get("path", ""))) / "tokenizer.json"
    return hashlib.sha256(path.read_bytes()).hexdigest() if config.get("pretrained") and path.is_file() else None


def check_same_text(evaluator: str | Path, run: str | Path) -> None:
    """One line unless the evaluator and ``run`` scored the same tokens: the same corpus (``data``),
    the same kind (trained or pretrained), the same tokenizer file where both are pretrained, and the
    same bytes wherever both scored the same number of tokens."""
    a, b = _config(Path(evaluator)), _config(Path(run))
    digests = _tokenizer_digest(a), _tokenizer_digest(b)
    differs = ("data" if a.get("data") != b.get("data") else
               "kind (trained or pretrained)" if bool(a.get("pretrained")) != bool(b.get("pretrained")) else
               "tokenizer" if None not in digests and digests[0] != digests[1] else None)
    if differs is None:
        rows_a, rows_b = read_results(Path(evaluator) / "results.csv"), read_results(Path(run) / "results.csv")
        both = rows_a[["tokens", "bytes"]].dropna().merge(rows_b[["tokens", "bytes"]].dropna(), on="tokens")
        differs = "scored text (bytes)" if (both.bytes_x != both.bytes_y).any() else None
    if differs:
        raise PosbenchError(f"longppl: {str(run)!r} and the evaluator {str(evaluator)!r} differ in {differs}; key "
                            "tokens are token positions, so the evaluator must score the same tokens: the same "
                            "corpus and tokenizer")


def joined(values: np.ndarray) -> str:
    """A block column's cell: the values ';'-joined (counts as integers, sums to 17 digits)."""
    return ";".join(str(int(v)) if float(v).is_integer() and abs(v) < 2**53 else repr(float(v)) for v in values)


def block_columns(nll: np.ndarray, key: np.ndarray) -> dict[str, str]:
    """The per-block sums a report's intervals need (:func:`posbench.intervals.block_sums`: the
    scored tokens cut into BLOCKS contiguous blocks, as the perplexity bootstrap cuts them): each
    block's NLL sum over all tokens and over the key tokens, and its key-token count."""
    from ..intervals import block_sums

    x = np.asarray(nll, np.float64)
    sums, _ = block_sums(x)
    key_sums, _ = block_sums(np.where(key, x, 0.0))
    counts, _ = block_sums(key.astype(np.float64))
    return {"nll_blocks": joined(sums), "key_nll_blocks": joined(key_sums), "key_block_tokens": joined(counts)}


def longppl_rows(run: str | Path, keys: KeyTokens, scored: tuple | None = None) -> pd.DataFrame:
    """One row (:data:`COLUMNS`) per results row of ``run`` in the key tokens' split with its
    per-token NLL stored: LongPPL and the perplexity over the same tokens 1 .. ``tokens``, with
    their per-block sums (:func:`block_columns`) for the report's intervals. ``scored``: the run's
    :func:`_scored_rows`, where the caller has read them already."""
    rows, stored = scored or _scored_rows(Path(run), keys.split)
    out = []
    for row in rows.to_dict("records"):
        nll = stored[row_key(row)]
        n = min(nll.size, keys.mask.size)
        value, count = longppl(nll[:n], keys.mask[:n])
        out.append({**{k: row[k] for k in KEY + METHOD}, "model": row["model"], "data": row["data"], "tokens": n,
                    "key_tokens": count, "longppl": value, "ppl": math.exp(float(np.mean(nll[:n], dtype=np.float64))),
                    **keys.how(), "config_hash": row["config_hash"], **block_columns(nll[:n], keys.mask[:n])})
    return with_method(pd.DataFrame(out, columns=COLUMNS))  # its columns typed as every reader's


def study_longppl(evaluator: str | Path, runs: list[str | Path], short_len: int | None = None,
                  short_stride: int | None = None, long_len: int | None = None, split: str = "validation",
                  alpha: float = ALPHA, beta: float = BETA) -> pd.DataFrame:
    """LongPPL of every row of ``runs`` (run dirs) on one key-token set: the evaluator's
    (:func:`select_key_tokens`, ``short_len`` default the smallest train_len of ``runs``), cut to
    the fewest tokens any row scored, so every row averages over the same key tokens."""
    return longppl_table(study_keys(evaluator, runs, short_len, short_stride, long_len, split, alpha, beta), runs)


def study_keys(evaluator: str | Path, runs: list[str | Path], short_len: int | None = None,
               short_stride: int | None = None, long_len: int | None = None, split: str = "validation",
               alpha: float = ALPHA, beta: float = BETA) -> KeyTokens:
    """The evaluator's key tokens for ``runs`` (:func:`select_key_tokens`; ``short_len`` default the
    smallest train_len of ``runs``), once each run is checked to score the same text."""
    if not runs:
        raise PosbenchError("longppl: no runs given; valid: run dirs or sweep dirs holding results.csv")
    _scored_rows(Path(evaluator), split)  # one line where the evaluator has no results
    scored = [_scored_rows(Path(run), split)[0] for run in runs]
    bare = [str(run) for run, rows in zip(runs, scored) if not len(rows)]
    if bare:
        raise PosbenchError(f"longppl: {', '.join(bare[:3])}{' and more' if len(bare) > 3 else ''} hold(s) no ok "
                            f"{split} row with its per-token NLL in {TOKEN_NLL} (written by posbench eval since it "
                            "stores them); valid: evaluate them again (posbench eval checkpoint=RUN "
                            "eval.recompute=true), or leave them out")
    for run in runs:
        check_same_text(evaluator, run)
    if short_len is None:
        short_len = int(min(rows.train_len.min() for rows in scored if len(rows)))
    return select_key_tokens(evaluator, short_len, short_stride, long_len, split, alpha, beta)


def longppl_table(keys: KeyTokens, runs: list[str | Path], kept: pd.DataFrame | None = None) -> pd.DataFrame:
    """LongPPL of every row of ``runs`` on ``keys``, cut to the fewest tokens any row scored (so every
    row averages over the same key tokens), and the rows of ``kept`` (an earlier longppl.csv on the
    same key tokens) that ``runs`` do not compute again: where a run's per-token NLLs are gone (a
    fresh machine), its rows written before stay. A kept row that scored more tokens than the new
    fewest cannot be cut without them: one line names it."""
    scored = [_scored_rows(Path(run), keys.split) for run in runs]
    counts = [stored[row_key(r)].size for rows, stored in scored for r in rows.to_dict("records")]
    if kept is not None and len(kept):
        how = keys.how()
        if any(kept[k].nunique() != 1 or kept[k].iloc[0] != v for k, v in how.items()):
            raise PosbenchError(f"longppl: the rows kept were chosen otherwise ({_how_text(kept)}) than now "
                                f"({_how_text(pd.DataFrame([how]))}); valid: the same evaluator and options, or "
                                "remove the old longppl.csv")
        counts.append(int(kept.tokens.min()))
    fewest = min([keys.mask.size] + counts)
    parts = [longppl_rows(run, keys.truncated(fewest), got) for run, got in zip(runs, scored)]
    table = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS)
    if kept is None or not len(kept):
        return table
    kept = with_method(kept).reindex(columns=COLUMNS)  # rows kept from before the block sums: those columns empty
    identity = KEY + ["model", "data", "config_hash"]  # as merge_csv drops the old rows a new one replaces
    kept = kept[~kept.set_index(identity).index.isin(table.set_index(identity).index)]
    long = kept[kept.tokens > fewest]
    if len(long):
        r = long.iloc[0]
        raise PosbenchError(f"longppl: {len(long)} kept row(s) scored {int(r.tokens)} tokens, more than the "
                            f"{fewest} the new rows share (first: {r.encoding} seed={r.seed} eval_len={r.eval_len}), "
                            "and their per-token NLLs are gone; valid: evaluate them again, or remove the old "
                            "longppl.csv")
    return pd.concat([kept, table], ignore_index=True) if len(table) else kept.reset_index(drop=True)


def _how_text(rows: pd.DataFrame) -> str:
    r = rows.iloc[0]
    return (f"evaluator {r.evaluator}, long {r.long_len}, short {r.short_len}/{r.short_stride}, alpha {r.alpha}, "
            f"beta {r.beta}")
