"""One token set per curve: which tokens an evaluation of a run scores.

Every length of a ladder scores tokens 1 .. n of its split (:mod:`posbench.eval.ladder`), so a
curve's ratios ppl(L) / ppl(train_len) and the report's paired intervals compare the same tokens.
That holds across evaluations only if a later one scores the n the run's rows already score; a
count drawn from the later call's own lengths and ``eval.max_tokens`` would put lengths of one
curve on other tokens (8,192 does not divide 126,976, so ``eval.lengths=[128,...,8192]`` once
rewrote the 128 row on 122,880 tokens beside 256 on 126,976).

So a run (or a pretrained model's output folder) holds one token set per split and protocol
(``eval.mode``): every row of results.csv in that split and mode, under every scaling and
extension, scores the same n. :func:`scored_count` picks it:

* rows there already: their n. A length that n cannot score (it must be a multiple of every
  length and, sliding, leave whole strides) is refused in one line naming the lengths that fit;
  so is an ``eval.max_tokens`` given on the command line that would score another count.
* no rows there: the other protocol's set where it fits these lengths and the command gives no
  ``eval.max_tokens`` (so a run's sliding and non-overlapping curves pair), else the largest count
  within ``eval.max_tokens`` (a trained run's own, from its config.yaml, unless the command gives
  one) that every length divides.
* ``eval.recompute=true`` may move the split and mode to a new set only when it computes again
  every row that holds the old one; otherwise it is refused, naming the rows it would leave.

A run written before this rule may hold two sets in one split and mode; a later evaluation is
then refused until ``eval.recompute=true`` scores them all on one, and the report refuses the
lines that mix them (:func:`posbench.report.collect.check_token_sets`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..config import MODES, EvalConfig
from ..errors import PosbenchError
from .results import read_results


def scored_tokens(tokens: np.ndarray, lengths: list[int], max_tokens: int, split: str,
                  ecfg: EvalConfig | None = None) -> int:
    """How many tokens every length scores (``ecfg`` None: non-overlapping windows)."""
    longest = max(lengths)
    available = tokens.size - 1
    if longest > available:
        raise PosbenchError(f"eval length {longest} is longer than the {available} {split} tokens available; "
                            f"valid: eval.lengths <= {available}")
    if longest > max_tokens:
        raise PosbenchError(f"eval.max_tokens={max_tokens} is smaller than the longest eval length {longest}; "
                            f"valid: eval.max_tokens >= {longest}")
    return (ecfg or EvalConfig()).scored_count(lengths, min(max_tokens, available))



def held_sets(results: Path, split: str) -> dict[str, dict[int, list[tuple[str, int, int]]]]:
    """mode -> token count -> the (rope_scaling, eval_len, stride) of every row of ``results`` in
    ``split`` and that mode that scores it (empty without rows)."""
    if not results.is_file():
        return {}
    df = read_results(results)
    df = df[(df.split == split) & df.tokens.notna()]
    held: dict[str, dict[int, list[tuple[str, int, int]]]] = {}
    for r in df.itertuples():
        held.setdefault(str(r.mode), {}).setdefault(int(r.tokens), []).append(
            (str(r.rope_scaling), int(r.eval_len), int(r.stride)))
    return held


def fitting(ecfg: EvalConfig, n: int, lengths: list[int]) -> list[int]:
    """Those of ``lengths`` that ``n`` scored tokens can be scored at (:meth:`EvalConfig.scored_count`'s
    rule: a multiple of the length and, sliding, whole strides after the first window)."""
    strides = ecfg.strides(lengths)
    return [length for length in lengths if length <= n and n % length == 0 and (n - length) % strides[length] == 0]


def _lengths(lengths) -> str:
    return ", ".join(f"{length:,}" for length in sorted(set(lengths)))


def _rows(entries: list[tuple[str, int, int]], mine: str = "") -> str:
    """'eval_len 128, 1,024' (rows of scaling ``mine`` alone) or 'none at 128; yarn at 256, 512'."""
    by: dict[str, list[int]] = {}
    for label, length, _ in entries:
        by.setdefault(label, []).append(length)
    if set(by) == {mine} or (len(by) == 1 and not mine):
        return f"eval_len {_lengths(next(iter(by.values())))}"
    return "; ".join(f"{label} at {_lengths(ls)}" for label, ls in by.items())


def _fits_text(ecfg: EvalConfig, n: int, smallest: int) -> str:
    """'128, 256, ..., 4,096': the powers of two times ``smallest`` that ``n`` tokens fit."""
    candidates = [c for c in (smallest << k for k in range(max(1, n // smallest).bit_length()))
                  if c <= n and (ecfg.stride or 0) <= c]
    fit = fitting(ecfg, n, candidates) if candidates else []
    return _lengths(fit) if fit else "none"


def scored_count(results: Path, tokens: np.ndarray, lengths: list[int], ecfg: EvalConfig, label: str,
                 budget_given: bool = True) -> int:
    """How many tokens an evaluation of ``lengths`` under scaling ``label`` scores into the run
    whose results.csv is ``results`` (module docstring). ``budget_given``: ``eval.max_tokens``
    came from the command line, not from the run's config."""
    split, mode = ecfg.split, ecfg.mode
    by_mode = held_sets(results, split)  # one read of results.csv for both protocols
    held = by_mode.get(mode, {})
    where = f"{results.parent}'s rows in {split}, {mode}"
    mine = {(label, length, stride) for length, stride in ecfg.strides(lengths).items()}
    if not held and not ecfg.recompute and not budget_given:  # the other protocol's set, where it fits
        other = by_mode.get(next(m for m in MODES if m != mode), {})
        if len(other) == 1 and len(fitting(ecfg, next(iter(other)), lengths)) == len(lengths):
            return next(iter(other))
    if ecfg.recompute or not held:
        n = scored_tokens(tokens, lengths, ecfg.max_tokens, split, ecfg)
        left = [e for m, entries in held.items() if m != n for e in entries if e not in mine]
        if left:
            raise PosbenchError(
                f"eval.recompute=true would score these lengths on {n:,} tokens, but {where} keep other sets "
                f"({_rows(left, label)}), and a run holds one token set per split and mode; valid: eval.lengths that "
                "cover those rows too, or, where they are another scaling's, lengths that fit the "
                f"{max(held, key=lambda m: len(held[m])):,} tokens they score")
        return n
    if len(held) > 1:
        shown = "; ".join(f"{m:,} tokens at {_rows(entries)}" for m, entries in sorted(held.items(), reverse=True))
        everything = sorted({length for entries in held.values() for _, length, _ in entries} | set(lengths))
        raise PosbenchError(f"{where} mix token sets ({shown}), so their curve compares other tokens at each "
                            f"length; valid: eval.recompute=true 'eval.lengths=[{','.join(map(str, everything))}]' "
                            "scores them all again on one set")
    (n,) = held
    if budget_given:
        wanted = scored_tokens(tokens, lengths, ecfg.max_tokens, split, ecfg)
        if wanted != n:
            raise PosbenchError(f"eval.max_tokens={ecfg.max_tokens} scores {wanted:,} tokens at these lengths, but "
                                f"{where} score {n:,}, and a run holds one token set per split and mode; valid: "
                                "leave eval.max_tokens out (the run's set is scored), or eval.recompute=true with "
                                "eval.lengths that cover every row of the run")
    misfit = [length for length in lengths if length not in fitting(ecfg, n, lengths)]
    if misfit:
        everything = sorted({length for _, length, _ in held[n]} | set(lengths))
        smallest = everything[0]
        raise PosbenchError(
            f"eval_len {_lengths(misfit)} cannot score the {n:,} {split} tokens that {where} score (every length "
            f"must divide them{', with whole strides' if mode == 'sliding' else ''}), and a run holds one token "
            f"set per split and mode; valid: lengths that fit ({_fits_text(ecfg, n, smallest)}), "
            f"or eval.recompute=true 'eval.lengths=[{','.join(map(str, everything))}]' to score every length "
            "again on one set that fits them all")
    return n
