"""Perplexity at a ladder of lengths, every length scoring exactly the same tokens.

The first ``n + 1`` validation tokens are scored at every length L: tokens 1 .. n are
predicted exactly once each, so differences across lengths come from the context the model
sees, not from which tokens were scored (Press et al. 2022, *Train Short, Test Long*).

* ``eval.mode=nonoverlapping``: windows of L tokens side by side; window w predicts tokens
  w*L+1 .. (w+1)*L.
* ``eval.mode=sliding``: windows of L tokens advance by ``eval.stride`` S (null: L // 2); the
  first window scores all its L tokens, each later one only its last S tokens, the ones new
  to it, so every token but the first L is predicted with at least L - S tokens of context
  (Press et al. 2022, appendix B "sliding window evaluation"; S = 1 is their analysis setting).

n is the largest count <= eval.max_tokens that is a multiple of every length and, when
sliding, leaves a whole number of strides after the first window
(:meth:`EvalConfig.scored_count`), so both modes score the same tokens.

Beside token perplexity each row has the tokenizer-independent bits per byte and word-level
perplexity of the scored text (as LM evaluation harnesses report them), and the mean NLL by
position inside the window, in bins, goes to ``positions.csv``; the NLL of every scored token
goes to ``token_nll.npz`` (:mod:`posbench.eval.token_nll`), for the report's paired bootstrap
intervals. ``docs/evaluation.md`` gives the formulas and the file formats.

A rotary model can be evaluated under a RoPE scaling (``eval.rope_scaling``, see
:mod:`posbench.encodings.rotary`) with factor ``eval.rope_factor`` or, when null, s =
max(1, L / train_len) at each length L; rows record both, and ``rope_scaling`` is part of
the row key, so one run's results.csv holds a row per scaling and length.

One function runs the ladder on whatever is evaluated, :func:`evaluate_subject`: a trained run
or a pretrained model opened as a :class:`~posbench.eval.probe.Subject`
(:mod:`posbench.eval.subject`); :func:`evaluate` is it as a plain function of the config.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from ..config import EvalConfig, code_version, config_hash
from ..data.positions import draw_positions
from ..encodings import PositionRangeError
from ..encodings.extension import Extension
from ..encodings.rotary import rope_scaling
from ..methods import Applied, scaling_factor
from ..model.build import autocast
from ..model.transformer import LanguageModel
from ..runs import threads
from ..runs.rundir import RunDir
from .pretrained import stored_ladder
from .probe import Subject
from .results import COLUMNS, KEY, METHOD, backfill, read_results, sort_rows, write_results
from .subject import extension_of, open_subject, scaling_label
from .token_nll import FILE as TOKEN_NLL
from .token_nll import read_token_nll, row_key
from .token_set import scored_count, scored_tokens


def unigram_perplexity(train: np.ndarray, scored: np.ndarray) -> float:
    """The perplexity on ``scored`` of a unigram model fitted on ``train`` (add-one smoothing over
    the ids either holds): what a model scores that learned only how often each token occurs. A
    trained model's perplexity near it has learned little of the context, so the report gives such
    a line no extrapolation verdict (:data:`posbench.report.verdicts.UNTRAINED`)."""
    size = int(max(train.max(initial=0), scored.max(initial=0))) + 1
    counts = np.bincount(train, minlength=size).astype(np.float64) + 1.0
    log_p = np.log(counts) - math.log(counts.sum())
    return float(np.exp(-log_p[scored].mean()))


def position_bins(length: int, starts: list[int] | None = None) -> list[tuple[int, int]]:
    """Inclusive (first, last) predicted-token positions of each bin inside a window of ``length``:
    ``starts`` cut there, or log2 bins 0, 1, 2-3, 4-7, ... (the last one ends at length - 1)."""
    if starts is None:
        starts = [0] + [2 ** k for k in range(max(0, length - 1).bit_length())]
    starts = [s for s in starts if s < length]
    return list(zip(starts, [s - 1 for s in starts[1:]] + [length - 1]))


def _byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the byte each character of a byte-level token stands for."""
    kept = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    moved = [b for b in range(256) if b not in kept]
    return {**{chr(b): b for b in kept}, **{chr(256 + i): b for i, b in enumerate(moved)}}


def text_size(tokenizer, ids) -> tuple[int, int]:
    """(UTF-8 bytes, whitespace-separated words) of the text that token ``ids`` spell.

    Bytes are exact: each byte-level BPE token is its own byte string, so no character cut at
    the ends of ``ids`` is re-encoded. Special tokens (the document separator) have no bytes
    and end a word; words are counted per document, on the bytes decoded as UTF-8."""
    decode = _byte_decoder()
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    try:
        table = {i: None if tok in special else bytes(decode[c] for c in tok)
                 for tok, i in tokenizer.get_vocab().items()}
    except KeyError:  # not byte-level BPE (a pretrained model's SentencePiece vocabulary): decode the text
        return _decoded_size(tokenizer, ids, special)
    docs, current = [], bytearray()
    for i in np.asarray(ids).tolist():
        piece = table[i]
        if piece is None:
            docs.append(bytes(current))
            current = bytearray()
        else:
            current += piece
    docs.append(bytes(current))
    return sum(map(len, docs)), sum(len(d.decode("utf-8", errors="replace").split()) for d in docs)


def _decoded_size(tokenizer, ids, special: set[str]) -> tuple[int, int]:
    """(UTF-8 bytes, words) of the decoded text of ``ids``, documents split at special tokens.
    Exact but for characters cut at the two ends of ``ids``."""
    special_ids = {tokenizer.token_to_id(t) for t in special}
    docs, current = [], []
    for i in np.asarray(ids).tolist():
        if i in special_ids:
            docs.append(current)
            current = []
        else:
            current.append(i)
    texts = [tokenizer.decode(d) for d in docs + [current]]
    return sum(len(t.encode()) for t in texts), sum(len(t.split()) for t in texts)


def window_nll(model: LanguageModel, ids: torch.Tensor, length: int, stride: int, batch_tokens: int,
               device: torch.device, dtype, desc: str = "",
               random_positions: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Windows of ``length`` over ``ids`` (n + 1 tokens) advancing by ``stride``; the first scores all
    its tokens, each later one its last ``stride`` -> (NLL sum, tokens scored) by predicted-token
    position 0 .. length-1 inside the window, and the (n,) float32 NLL of targets 1 .. n in order.
    Every target 1 .. n is scored once. With ``random_positions`` = L each batch of windows gets a
    sorted random subset of [0, L) as positions (Ruoss et al. 2023), drawn from a generator seeded
    by the length, so every run and model sees the same positions at a length."""
    inputs, targets = ids[:-1].unfold(0, length, stride), ids[1:].unfold(0, length, stride)  # (K, L)
    fresh = length - stride  # positions fresh.. are new to every window after the first
    sums = torch.zeros(length, dtype=torch.float64)
    per_token = []  # target order: the first window's older positions, then each window's fresh ones
    per_batch = max(1, batch_tokens // length)
    generator = torch.Generator().manual_seed(length)
    progress = Progress(desc, inputs.shape[0])
    for i in tqdm(range(0, inputs.shape[0], per_batch), desc=desc, leave=False, disable=None, file=sys.stderr):
        progress.done(i)
        threads.tick()
        x = inputs[i:i + per_batch].contiguous().to(device)
        y = targets[i:i + per_batch].contiguous().to(device)
        with autocast(device, dtype):
            positions = draw_positions(length, random_positions, generator)
            hidden = model.hidden(x, None if positions is None else positions.to(device))  # (B, L, D)
            nll = model.head_nll(hidden[:, fresh:], y[:, fresh:]).cpu()  # (B, L - fresh)
            sums[fresh:] += nll.double().sum(0)
            if i == 0 and fresh:  # the first window's older positions
                first = model.head_nll(hidden[0, :fresh], y[0, :fresh]).cpu()
                sums[:fresh] += first.double()
                per_token.append(first.float())
            per_token.append(nll.float().flatten())
    counts = np.full(length, inputs.shape[0], dtype=np.int64)
    counts[:fresh] = 1
    return sums.numpy(), counts, torch.cat(per_token).numpy()


PROGRESS_EVERY = 60.0  # seconds between a length's progress lines in a log


class Progress:
    """A line ``posbench: eval L=...: k of K windows, t s`` at most every ``PROGRESS_EVERY``
    seconds where stderr is not a terminal (logs, sweeps, studies), where tqdm hides its bar: a
    pretrained model's long lengths take many minutes on a CPU, and a log that says nothing for
    that long cannot be told from a stuck job."""

    def __init__(self, desc: str, windows: int):
        self.desc, self.windows = desc, windows
        self.quiet = sys.stderr.isatty()  # the bar shows it
        self.started = self.last = time.perf_counter()

    def done(self, k: int) -> None:
        """``k`` windows are scored."""
        now = time.perf_counter()
        if self.quiet or k == 0 or now - self.last < PROGRESS_EVERY:
            return
        self.last = now
        print(f"posbench: {self.desc}: {k} of {self.windows} windows, {now - self.started:.0f} s",
              file=sys.stderr, flush=True)


@torch.no_grad()
def perplexity_ladder(model: LanguageModel, tokens: np.ndarray, lengths: list[int], ecfg: EvalConfig,
                      device: torch.device, dtype, *, tokenizer=None, n_tokens: int | None = None,
                      random_positions: int | None = None, ext: Extension | None = None,
                      text: tuple[int, int] | None = None, unigram: float | None = None) -> list[dict]:
    """-> one dict per length: eval_len, rope_scaling, rope_factor, mode, stride, nll, ppl, bpb,
    word_ppl, tokens, bytes, words, status, params and pos_params (the model's parameter counts,
    :meth:`LanguageModel.param_counts`), ``positions`` (the binned NLL by position) and
    ``token_nll`` (the (n,) float32 NLL of targets 1 .. n, None when the length cannot run).

    ``n_tokens`` fixes the scored count (default: :func:`scored_tokens` of ``lengths``); without
    ``tokenizer`` bytes, words, bpb and word_ppl are None. Under ``ecfg.rope_scaling`` each window
    of L tokens is rotated with factor ``ecfg.rope_factor``, or s = max(1, L / train_len) when null.
    ``random_positions``: the run's ``train.random_positions`` (see :func:`window_nll`). ``ext``: the
    extension, where the caller has built it already (default: :func:`extension_of` ``ecfg``). ``text``: (bytes,
    words) of the scored text, where the caller has counted them (default: :func:`text_size`); ``unigram``:
    the scored tokens' :func:`unigram_perplexity`, each row's ``unigram_ppl``."""
    n = n_tokens or scored_tokens(tokens, lengths, ecfg.max_tokens, ecfg.split, ecfg)
    strides = ecfg.strides(lengths)
    ids = torch.from_numpy(tokens[: n + 1].astype(np.int64))
    if text is None:
        text = text_size(tokenizer, ids[1:]) if tokenizer is not None else (None, None)
    nbytes, words = text
    kind = ecfg.rope_scaling
    train_len = model.encoding.reference_len  # what s is relative to
    if ext is None:
        ext = extension_of(ecfg, model.encoding.dims.train_len)
    model.check_method(ext, kind)
    applied = Applied.of(kind, ext)
    model.eval()
    rows = []
    with rope_scaling(model.encoding, kind, ecfg.rope_factor), model.encoding.extended(ext):
        for length in lengths:
            stride = strides[length]
            row = {"eval_len": length, **applied.columns(), "mode": ecfg.mode, "stride": stride,
                   "rope_factor": scaling_factor(kind, ecfg.rope_factor, length, train_len),
                   "tokens": n, "bytes": nbytes, "words": words, "status": "ok", "positions": [], "token_nll": None,
                   "unigram_ppl": unigram, **model.param_counts()}
            desc = f"eval L={length}" + (f" stride={stride}" if ecfg.mode == "sliding" else "")
            started = time.perf_counter()
            try:
                sums, counts, per_token = window_nll(model, ids, length, stride, ecfg.batch_tokens, device, dtype,
                                                     desc, random_positions)
            except PositionRangeError as e:
                rows.append({**row, "nll": math.nan, "ppl": math.nan, **text_metrics(math.nan, n, nbytes, words),
                             "status": f"n/a: {e}"})
                print(f"posbench: eval L={length}: n/a", file=sys.stderr, flush=True)
                continue
            # a line per length, also where tqdm hides its bar (stderr not a terminal: logs, sweeps)
            print(f"posbench: eval L={length}: {(n - length) // stride + 1} windows in "
                  f"{time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
            assert counts.sum() == n == per_token.size  # every target 1 .. n once
            nll = sums.sum() / n
            positions = [{"bin_start": a, "bin_end": b, "nll": sums[a:b + 1].sum() / counts[a:b + 1].sum(),
                          "tokens": int(counts[a:b + 1].sum())} for a, b in position_bins(length, ecfg.position_bins)]
            rows.append({**row, "nll": nll, "ppl": math.exp(nll), **text_metrics(nll, n, nbytes, words),
                         "positions": positions, "token_nll": per_token})
    return rows


def text_metrics(nll: float, tokens: int, nbytes: int | None, words: int | None) -> dict:
    """Bits per byte, total NLL / (ln 2 * bytes), and word perplexity, exp(total NLL / words)."""
    total = nll * tokens
    return {"bpb": total / (math.log(2) * nbytes) if nbytes else None,
            "word_ppl": math.exp(total / words) if words else None}


def result_rows(cfg: DictConfig, ladder: list[dict], steps: int, execution: str | None = None) -> pd.DataFrame:
    """results.csv rows of a ladder (columns ``COLUMNS``), ``execution`` how the run trained
    (:meth:`RunDir.execution`; None where unknown or not trained here); the binned positions ride along in
    ``rows.attrs["positions"]`` and the per-token NLL in ``rows.attrs["token_nll"]`` (by
    :func:`posbench.eval.token_nll.row_key`) for :func:`posbench.eval.results.write_results`."""
    meta = {"split": cfg.eval.split, "encoding": cfg.encoding.name, "model": cfg.model.name, "data": cfg.data.name,
            "train_len": int(cfg.train.train_len), "seed": int(cfg.seed), "steps": steps,
            "init_len": cfg.train.get("init_len"),  # a fine-tuned run's parent's train_len
            "config_hash": config_hash(cfg), "code_version": code_version(), "execution": execution,
            **Applied().columns(), "rope_factor": 1.0, "mode": "nonoverlapping"}  # a ladder row's own values win
    rows = backfill(pd.DataFrame([{**meta, **row} for row in ladder]))[COLUMNS]
    rows.attrs["positions"] = [{**meta, **{k: row[k] for k in KEY + METHOD if k in row}, **pos}
                               for row in ladder for pos in row.get("positions", [])]
    rows.attrs["token_nll"] = {row_key({**meta, **row}): row["token_nll"] for row in ladder
                               if row.get("token_nll") is not None}
    return rows


def existing_rows(run: RunDir, train_cfg: DictConfig, ecfg: EvalConfig, lengths: list[int], n: int,
                  ext: Extension) -> pd.DataFrame:
    """Rows of results.csv that this evaluation would compute again: same key, config hash, rope
    factor and scored token count, status ok, bits per byte present, and the per-token NLL in
    token_nll.npz (rows written before it existed are computed again)."""
    if not run.results.exists():
        return pd.DataFrame(columns=COLUMNS)
    df = backfill(read_results(run.results))
    train_len, strides = int(train_cfg.train.train_len), ecfg.strides(lengths)
    original = int(train_cfg.encoding.get("original_len") or train_len)  # what a scaling's s is relative to
    factor = [scaling_factor(ecfg.rope_scaling, ecfg.rope_factor, int(n_), original) for n_ in df.eval_len]
    label = scaling_label(ecfg.rope_scaling, ext)
    same = ((df.encoding == train_cfg.encoding.name) & (df.rope_scaling == label)
            & (df.train_len == train_len) & (df.seed == int(train_cfg.seed)) & (df.split == ecfg.split)
            & (df["mode"] == ecfg.mode) & df.eval_len.isin(lengths) & (df.stride == df.eval_len.map(strides))
            & (df.config_hash == config_hash(train_cfg)) & (df.status == "ok") & (df.tokens == n)
            & np.isclose(df.rope_factor, factor) & df.bpb.notna())
    stored = read_token_nll(run.path / TOKEN_NLL)
    kept = [key in stored and stored[key].size == n for key in map(row_key, df.to_dict("records"))]
    return df[same.fillna(False).astype(bool) & np.array(kept, dtype=bool)].reset_index(drop=True)


def rows_to_compute(run: RunDir, train_cfg: DictConfig, ecfg: EvalConfig, lengths: list[int], n: int,
                    ext: Extension, step: int | None = None) -> tuple[pd.DataFrame, list[int]]:
    """-> (the rows results.csv already holds for this evaluation, :func:`existing_rows`; the
    lengths still to compute), saying on stderr which lengths are kept. ``eval.recompute=true``
    keeps none; ``step``: keep only rows of a model at that step (a training run's own ladder)."""
    if ecfg.recompute:
        return pd.DataFrame(columns=COLUMNS), list(lengths)
    done = existing_rows(run, train_cfg, ecfg, lengths, n, ext)
    if step is not None:
        done = done[done.steps == step].reset_index(drop=True)
    todo = [length for length in lengths if length not in set(done.eval_len)]
    if len(done):
        which = "all lengths" if not todo else "eval_len " + ", ".join(map(str, done.eval_len))
        print(f"posbench: {which} already in {run.results} (status ok, config hash {done.config_hash.iloc[0]}, "
              f"{n} tokens): not recomputed (eval.recompute=true recomputes them)", file=sys.stderr)
    return done, todo


def evaluate(cfg: DictConfig) -> pd.DataFrame:
    """`posbench eval checkpoint=<run dir>` or `pretrained=PATH`: the ladder of the subject
    :func:`~posbench.eval.subject.open_subject` opens (:func:`evaluate_subject`)."""
    return evaluate_subject(open_subject(cfg))


@dataclass
class LadderPlan:
    """What an evaluation computes: ``todo``, the lengths to compute under the scaling and
    extension; ``same``, those they leave as trained, whose rows are the unscaled ones
    (:attr:`Subject.reuses_unscaled`): ``stored`` already (eval_len -> ladder entry) or ``plain``
    to compute under ``none``."""

    todo: list[int]
    same: list[int] = field(default_factory=list)
    stored: dict[int, dict] = field(default_factory=dict)
    plain: list[int] = field(default_factory=list)


def ladder_plan(subject: Subject, label: str, lengths: list[int], n: int) -> LadderPlan:
    """The lengths to compute: those whose rows ``subject.out`` does not hold already (all with
    ``eval.recompute=true``), saying on stderr which it keeps. Where the subject reuses unscaled
    rows, a length that the scaling and extension leave as the model trained (scale factor 1,
    every distance inside the extension's window, log-n inside the trained context) is the row of
    ``none``, computed once under ``none`` and stored under both names."""
    ecfg, ext, out = subject.ecfg, subject.ext, subject.out
    if not subject.reuses_unscaled:
        return LadderPlan(rows_to_compute(RunDir(out), subject.rows_config, ecfg, lengths, n, ext)[1])
    done = {} if ecfg.recompute else stored_ladder(out, subject.rows_config, ecfg, label, lengths, n)
    same = [length for length in lengths if length not in done and label != "none" and ext.identity_at(length)
            and scaling_factor(ecfg.rope_scaling, ecfg.rope_factor, length, subject.train_len) == 1.0]
    plain_cfg = dataclasses.replace(ecfg, rope_scaling="none", extension="none")
    plain = {} if ecfg.recompute or not same else stored_ladder(out, subject.rows_config, plain_cfg, "none", same, n)
    if done:
        print(f"posbench: {label}: eval_len {', '.join(map(str, sorted(done)))} already in {out / 'results.csv'}: "
              "not recomputed (eval.recompute=true recomputes them)", file=sys.stderr)
    if same:
        print(f"posbench: {label}: eval_len {', '.join(map(str, same))} run the model as trained (factor 1, "
              "every distance inside the window): the rows of rope_scaling none", file=sys.stderr)
    return LadderPlan([length for length in lengths if length not in done and length not in same], same, plain,
                      [length for length in same if length not in plain])


def evaluate_subject(subject: Subject) -> pd.DataFrame:
    """The ladder of a trained run or a pretrained model at its lengths (``eval.lengths``, else its
    default multiples of the trained context), each length's rows written to ``subject.out`` as
    soon as they exist, so a cut-off evaluation keeps every length it finished. Nothing is computed
    twice (:func:`ladder_plan`); a trained run's weights load only where a length is computed.
    -> this evaluation's rows of results.csv."""
    ecfg, ext = subject.ecfg, subject.ext
    corpus = subject.corpus()
    tokens = corpus.splits[ecfg.split]
    lengths = subject.ladder_lengths()
    ecfg.strides(lengths)
    applied = Applied.of(ecfg.rope_scaling, ext)
    label = applied.label
    n = scored_count(RunDir(subject.out).results, tokens, lengths, ecfg, label, subject.budget_given)
    plan = ladder_plan(subject, label, lengths, n)
    plain_cfg = dataclasses.replace(ecfg, rope_scaling="none", extension="none")
    if plan.todo or plan.plain:
        subject.preflight(ecfg if plan.todo else plain_cfg, plan.todo or plan.plain)
    subject.prepare_out()  # every check has passed
    run = RunDir(subject.out)
    counted = corpus.tokenizer is not None and (plan.todo or plan.plain)  # once, for every length
    text = text_size(corpus.tokenizer, tokens[1:n + 1]) if counted else None
    unigram = unigram_perplexity(corpus.splits["train"], tokens[1:n + 1]) if plan.todo or plan.plain else None

    def ladder(length: int, cfg: EvalConfig, **extension) -> list[dict]:
        return perplexity_ladder(subject.model, tokens, [length], cfg, subject.device, subject.dtype,
                                 tokenizer=corpus.tokenizer, n_tokens=n, random_positions=subject.random_positions,
                                 text=text, unigram=unigram, **extension)

    execution = run.execution()  # how the run trained (versions.json), read once for every length's rows

    def store(entries: list[dict]) -> None:
        if entries:
            write_results(run, result_rows(subject.rows_config, entries, subject.step, execution))

    for length in plan.plain:  # under none, stored under both names
        row = ladder(length, plain_cfg)[0]
        store([row, {**row, **applied.columns(), "rope_factor": 1.0}])
    store([{**plan.stored[length], **applied.columns(), "rope_factor": 1.0} for length in plan.same
           if length in plan.stored])
    for length in plan.todo:  # the row key names the extension, so no method's rows replace another's
        store(ladder(length, ecfg, ext=ext))
    return evaluation_rows(subject, label, lengths)


def evaluation_rows(subject: Subject, label: str, lengths: list[int]) -> pd.DataFrame:
    """The rows of ``subject.out``'s results.csv that an evaluation at ``lengths`` under scaling
    ``label`` made or kept: the subject's own, in the eval config's split, mode and strides."""
    run, ecfg, meta = RunDir(subject.out), subject.ecfg, subject.rows_config
    if not run.results.exists():
        return pd.DataFrame(columns=COLUMNS)
    rows = backfill(read_results(run.results))
    strides = ecfg.strides(lengths)
    mine = ((rows.encoding == meta.encoding.name) & (rows.rope_scaling == label)
            & (rows.train_len == int(meta.train.train_len)) & (rows.seed == int(meta.seed))
            & (rows.split == ecfg.split) & (rows["mode"] == ecfg.mode) & rows.eval_len.isin(lengths)
            & (rows.stride == rows.eval_len.map(strides)))
    return sort_rows(rows[mine.fillna(False).astype(bool)], KEY)
