"""Passkey retrieval: can the model find a number hidden in a long run of filler text?

Mohtashami & Jaggi 2023 (*Landmark Attention*, sec. 4.2): a random 5-digit key is hidden at a
chosen depth of repeated filler ("The grass is green. The sky is blue. The sun is yellow. Here
we go. There and back again."), in the sentence "The pass key is 71432. Remember it. 71432 is
the pass key.", and the prompt ends with "What is the pass key? The pass key is". Here every
piece is tokenized with a leading space and joined by spaces (so each piece tokenizes the same
alone and in the prompt, and the prompt is cut to an exact token count); the paper's opening
instruction is left out: these are base LMs, and it would make the shortest prompt 30 tokens
longer.

``posbench eval probe=passkey checkpoint=<run dir>``: for each length L (probe.lengths, default
multiples of train_len) and depth d, ``probe.trials`` prompts, with the key sentence starting at
the filler sentence boundary nearest d x (filler tokens). A row at length L uses exactly L
positions: the prompt is L - (k - 1) tokens for a key of k tokens, so that the prompt plus the
key's tokens but the last, the one forward pass, is L tokens, and the last key token is
predicted at position L - 1 (a model trained on L tokens is probed at 1x within its positions).
Scores:

* ``accuracy``: greedy decoding reproduces the key's tokens exactly. Read by teacher forcing
  in that forward pass: greedy decoding yields the key iff every key token is the argmax given
  the prompt and the key tokens before it;
* ``logprob``: the mean natural-log probability of the key's tokens under the same pass,
  averaged over trials: a soft figure that moves before accuracy does (a model with no idea
  of the key scores about -ln(vocab size)).

Rows go to ``passkey.csv`` in the run dir, merged by (encoding, rope_scaling, train_len, seed,
length, depth); a length the model cannot represent (a learned table) gets accuracy NaN and
status ``n/a: ...``. :class:`Passkey` is the probe registered as ``passkey``
(:mod:`posbench.eval.probes`).
"""

from __future__ import annotations

import math
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..config import ladder_lengths, not_empty, positive
from ..encodings import PositionRangeError
from ..errors import PosbenchError
from ..model.build import autocast
from .probe import Probe, Subject, encode_piece
from .results import METHOD

FILLER = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.")
KEY_SENTENCE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"
KEY = ["encoding", "rope_scaling", "train_len", "seed", "length", "depth"]
COLUMNS = KEY + ["trials", "correct", "accuracy", "logprob", "config_hash", "code_version", "status"] + METHOD


@dataclass
class PasskeyConfig:
    """The passkey probe's options (conf/probe/passkey.yaml)."""

    lengths: list[int] | None = None  # prompt lengths in tokens; None: multiples x train_len
    multiples: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    trials: int = 10  # prompts (keys) per length and depth
    seed: int = 0  # picks the keys: the same keys at every length and depth

    def __post_init__(self):
        positive("probe.trials", self.trials)
        not_empty("probe.lengths", self.lengths, "null (probe.multiples x train.train_len) "
                  "or a list of positive prompt lengths, e.g. [128,512]")
        not_empty("probe.multiples", self.multiples, "a list of positive multiples of train.train_len, e.g. [1,2,4]")
        for length in list(self.lengths or []) + list(self.multiples):
            positive("probe.lengths" if self.lengths else "probe.multiples", length)
        if not self.depths:
            raise PosbenchError("probe.depths is empty; valid: depths in [0, 1], e.g. [0,0.5,1]")
        for i, depth in enumerate(self.depths):
            if not 0 <= depth <= 1:
                raise PosbenchError(f"probe.depths[{i}]={depth} is not in [0, 1] "
                                    "(0: key before the filler, 1: after it); valid: e.g. [0,0.25,0.5,0.75,1]")

    def resolve_lengths(self, train_len: int) -> list[int]:
        return ladder_lengths(self.lengths, self.multiples, train_len)

    def keys(self) -> list[int]:
        return np.random.default_rng(self.seed).integers(10_000, 100_000, self.trials).tolist()


@dataclass
class Prompt:
    ids: list[int]  # the prompt: the requested length minus the answer's tokens but one
    answer: list[int]  # the key's tokens as they follow the question (" 71432")
    key_start: int  # index in ids of the key sentence's first token
    filler: int  # filler tokens in ids

    @property
    def forward_ids(self) -> list[int]:
        """The teacher-forced input: the prompt and the key's tokens but the last; exactly the
        requested length."""
        return self.ids + self.answer[:-1]


def min_length(tokenizer, key: int) -> int:
    """Tokens of the key sentence, the question and the key's tokens but the last: the shortest
    probe length (no filler)."""
    return (len(encode_piece(tokenizer, KEY_SENTENCE.format(key=key))) + len(encode_piece(tokenizer, QUESTION))
            + len(encode_piece(tokenizer, str(key))) - 1)


def passkey_prompt(tokenizer, length: int, depth: float, key: int) -> Prompt:
    """Filler sentences cycled around the key sentence, which starts at the sentence boundary
    nearest ``depth`` x (filler tokens), then the question; the filler's last sentence may be cut
    so that the prompt plus the key's tokens but the last (:attr:`Prompt.forward_ids`) is exactly
    ``length`` tokens."""
    key_ids, question = encode_piece(tokenizer, KEY_SENTENCE.format(key=key)), encode_piece(tokenizer, QUESTION)
    answer = encode_piece(tokenizer, str(key))
    filler = length - (len(answer) - 1) - len(key_ids) - len(question)
    if filler < 0:
        raise PosbenchError(f"probe length {length} is too short for the passkey prompt (key sentence, question "
                            f"and key take {length - filler} tokens); valid: probe.lengths >= {length - filler}")
    stream, bounds = filler_stream(tokenizer, filler)
    at = min(bounds, key=lambda b: abs(b - depth * filler))
    ids = stream[:at] + key_ids + stream[at:] + question
    return Prompt(ids, answer, at, filler)


def filler_stream(tokenizer, n: int) -> tuple[list[int], list[int]]:
    """``n`` tokens of the filler sentences cycled (the last one cut), and the sentence boundaries
    within them (0 included): where a needle may be put."""
    sentences = [encode_piece(tokenizer, s) for s in FILLER]
    stream, bounds = [], [0]
    while len(stream) < n:
        stream += sentences[(len(bounds) - 1) % len(sentences)]
        bounds.append(len(stream))
    return stream[:n], [b for b in bounds if b <= n]


def answer_logits(model, x: torch.Tensor, start: int) -> torch.Tensor:
    """Logits (B, T - start, V) of ``x`` (B, T) at positions ``start`` .. T - 1 alone. A model with
    ``hidden`` and ``logits`` (posbench's LanguageModel, a PretrainedLM) makes the head's logits at
    those positions only: Gemma 3's 262k vocabulary over a whole 8k prompt would be 8.6 GB of fp32
    logits, over 32k 34 GB, where the key needs a handful of rows. Any other causal LM
    (``model(x) -> (B, T, V)``) is called whole and sliced."""
    if hasattr(model, "hidden") and hasattr(model, "logits"):
        return model.logits(model.hidden(x)[:, start:])
    return model(x)[:, start:]


@torch.no_grad()
def score_prompts(model, prompts: list[Prompt], device: torch.device, dtype, batch_tokens: int):
    """-> (greedy decoding reproduces the key, mean log-prob of the key's tokens) per prompt.
    One teacher-forced pass over :attr:`Prompt.forward_ids`, batched by (prompt, key) lengths."""
    correct, logprob = np.zeros(len(prompts), dtype=bool), np.zeros(len(prompts))
    by_length: dict[tuple[int, int], list[int]] = {}
    for i, p in enumerate(prompts):
        by_length.setdefault((len(p.ids), len(p.answer)), []).append(i)
    for (prompt_len, answer_len), members in by_length.items():
        per_batch = max(1, batch_tokens // (prompt_len + answer_len - 1))
        for j in range(0, len(members), per_batch):
            batch = members[j:j + per_batch]
            x = torch.tensor([prompts[i].forward_ids for i in batch], device=device)  # (B, T)
            answer = torch.tensor([prompts[i].answer for i in batch], device=device)  # (B, k)
            with autocast(device, dtype):
                logits = answer_logits(model, x, prompt_len - 1)  # (B, k, V)
            logp = logits.float().log_softmax(-1)
            correct[batch] = (logp.argmax(-1) == answer).all(-1).cpu().numpy()
            logprob[batch] = logp.gather(-1, answer[..., None])[..., 0].mean(-1).double().cpu().numpy()
    return correct, logprob


def passkey_probe(model, tokenizer, pcfg: PasskeyConfig, lengths: list[int], device: torch.device, dtype,
                  batch_tokens: int = 16384, scaling=lambda length: nullcontext()) -> list[dict]:
    """-> one dict per (length, depth): length, depth, trials, correct, accuracy, logprob, status.
    ``scaling(length)`` is a context manager around each length's forward passes (RoPE scaling)."""
    keys = pcfg.keys()
    shortest = max(min_length(tokenizer, key) for key in keys)
    if min(lengths) < shortest:
        raise PosbenchError(f"probe length {min(lengths)} is too short for the passkey prompt (key sentence, "
                            f"question and key take up to {shortest} tokens); valid: probe.lengths >= {shortest}")
    return score_cells("passkey", model, lambda length, depth: [passkey_prompt(tokenizer, length, depth, key)
                                                                for key in keys],
                       lengths, pcfg.depths, device, dtype, batch_tokens, scaling)


def score_cells(name: str, model, prompts_of, lengths: list[int], depths: list[float], device: torch.device, dtype,
                batch_tokens: int, scaling=lambda length: nullcontext()) -> list[dict]:
    """The rows of a prompt probe (passkey, the needles): per (length, depth), the prompts
    ``prompts_of(length, depth)`` scored by :func:`score_prompts` -> length, depth, trials,
    correct, accuracy, logprob, status (``n/a: ...`` where the model cannot represent the
    length), and a progress line per finished length."""
    model.eval()
    rows = []
    cells = [(length, depth) for length in lengths for depth in depths]
    started = time.perf_counter()
    for i, (length, depth) in enumerate(tqdm(cells, desc=name, leave=False, disable=None, file=sys.stderr)):
        prompts = prompts_of(length, depth)
        row = {"length": length, "depth": depth, "trials": len(prompts)}
        try:
            with scaling(length):
                correct, logprob = score_prompts(model, prompts, device, dtype, batch_tokens)
            rows.append({**row, "correct": int(correct.sum()), "accuracy": float(correct.mean()),
                         "logprob": float(logprob.mean()), "status": "ok"})
        except PositionRangeError as e:
            rows.append({**row, "correct": None, "accuracy": math.nan, "logprob": math.nan, "status": f"n/a: {e}"})
        if (i + 1) % len(depths) == 0:  # the length's last depth
            tqdm.write(length_line(name, rows[-len(depths):], time.perf_counter() - started), file=sys.stderr)
            started = time.perf_counter()
    return rows


def length_line(name: str, rows: list[dict], seconds: float) -> str:
    """The progress line of one finished length, printed also where tqdm hides its bar (stderr
    not a terminal: logs, sweeps): ``posbench: passkey L=256: 50 prompts in 3.1 s, accuracy 0.42``."""
    ok = [r for r in rows if r["status"] == "ok"]
    prompts = sum(r["trials"] for r in rows)
    accuracy = f"accuracy {sum(r['correct'] for r in ok) / sum(r['trials'] for r in ok):.2f}" if ok else "n/a"
    return f"posbench: {name} L={rows[0]['length']}: {prompts} prompts in {seconds:.1f} s, {accuracy}"


def markdown_passkey(rows: pd.DataFrame) -> str:
    """Accuracy by length (rows) and depth (columns), and the mean key log-prob of each length."""
    depths = sorted(rows.depth.unique())
    lines = ["| encoding | length | " + " | ".join(f"depth {d:g}" for d in depths) + " | logprob |",
             "|" + "---|" * (3 + len(depths))]
    for (enc, scaling, length), g in rows.groupby(["encoding", "rope_scaling", "length"], sort=False):
        acc = dict(zip(g.depth, g.accuracy))
        cells = ["n/a" if math.isnan(acc[d]) else f"{acc[d]:.2f}" for d in depths if d in acc]
        label = enc if scaling == "none" else f"{enc}+{scaling}"
        lines.append(f"| {label} | {length} | " + " | ".join(cells) + f" | {g.logprob.mean():.2f} |")
    return "\n".join(lines)



class Passkey(Probe):
    """Passkey retrieval (module docstring): accuracy by length and depth of the key."""

    name = "passkey"
    paper = "Mohtashami & Jaggi 2023 (Landmark Attention, sec. 4.2)"
    description = "a 5-digit key hidden at a depth of filler text, asked for at the end"
    key = ("length", "depth")
    metric, grid = "accuracy", "depth"
    dtypes = {"correct": "Int64"}
    Options = PasskeyConfig

    def lengths(self, train_len: int) -> list[int]:
        return self.options.resolve_lengths(train_len)

    def run(self, subject: Subject, lengths: list[int]) -> list[dict]:
        return passkey_probe(subject.model, subject.tokenizer, self.options, lengths, subject.device, subject.dtype,
                             subject.batch_tokens, subject.scaling)

    def markdown(self, rows: pd.DataFrame) -> str:
        return markdown_passkey(rows)
