"""Needles with distractors: RULER's multi-key and multi-value needle-in-a-haystack probes.

Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language Models?"
(NVIDIA/RULER, ``scripts/data/synthetic/niah.py``): needles "One of the special magic numbers
for {key} is: {value}." are hidden in a haystack, and the model is asked for the value of one
key. Passkey retrieval has one needle and nothing to confuse it with; these have several:

* ``niah_multikey`` (RULER's niah_multikey_1): 4 needles with different keys; the question asks
  for one, the other three are distractors at random depths;
* ``niah_multivalue`` (RULER's niah_multivalue): one key with 4 values in 4 needles; the answer
  is all of them, in the order they appear.

As in RULER: keys are words, values 7-digit numbers, the needles' template and the question
("What is the special magic number for {key} mentioned in the provided text?") are RULER's, and
the answer follows "The special magic number for {key} mentioned in the provided text is"
(RULER's answer prefix). Differences, for base LMs and exact scoring: the haystack is RULER's
"noise" haystack, the passkey filler, not Paul Graham's essays (not shipped here); the opening
instruction is left out, as for passkey; keys come from a fixed list of 64 nouns
(:data:`WORDS`, RULER draws from the ``wonderwords`` package); multi-value answers are scored
in text order ("v1, v2, v3 and v4") by teacher forcing, where RULER's string match accepts any
order. The asked needle starts at the filler sentence boundary nearest ``depth`` x (filler
tokens); a row at length L uses exactly L positions, and the scores are passkey's
(:func:`posbench.eval.passkey.score_prompts`): ``accuracy`` (greedy decoding gives the whole
answer) and ``logprob``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..config import ladder_lengths, not_empty, positive
from ..errors import PosbenchError
from .passkey import Prompt, filler_stream, score_cells
from .probe import Probe, Subject, encode_piece

NEEDLE = "One of the special magic numbers for {key} is: {value}."
QUESTION = ("What is the special magic number for {key} mentioned in the provided text? "
            "The special magic number for {key} mentioned in the provided text is")
WORDS = ("apple", "river", "candle", "garden", "window", "pencil", "mountain", "bridge", "harbor", "lantern",
         "meadow", "violin", "anchor", "blanket", "cactus", "dolphin", "engine", "falcon", "glacier", "hammer",
         "island", "jacket", "kettle", "ladder", "marble", "needle", "orchard", "pepper", "quarry", "rocket",
         "saddle", "tunnel", "umbrella", "valley", "wagon", "yogurt", "zebra", "basket", "castle", "desert",
         "feather", "guitar", "helmet", "iceberg", "jungle", "kitten", "lemon", "mirror", "nickel", "oyster",
         "parrot", "quilt", "ribbon", "spider", "teapot", "velvet", "walnut", "button", "cherry", "dragon",
         "forest", "goblet", "hollow", "insect")


@dataclass
class NeedlesConfig:
    """A needles probe's options (conf/probe/niah_multikey.yaml, niah_multivalue.yaml); the
    defaults are niah_multikey's."""

    lengths: list[int] | None = None  # prompt lengths in tokens; None: multiples x train_len
    multiples: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    trials: int = 10  # prompts per length and depth
    seed: int = 0  # picks keys, values and the distractors' places: the same at every length
    keys: int = 4  # needles with different keys (the asked one and keys - 1 distractors)
    values: int = 1  # values of the asked key, each in a needle of its own

    def __post_init__(self):
        for name in ("trials", "keys", "values"):
            positive(f"probe.{name}", getattr(self, name))
        if self.keys > len(WORDS):
            raise PosbenchError(f"probe.keys={self.keys} is more than the {len(WORDS)} key words; "
                                f"valid: 1..{len(WORDS)}")
        not_empty("probe.lengths", self.lengths, "null (probe.multiples x train.train_len) "
                  "or a list of positive prompt lengths, e.g. [256,1024]")
        not_empty("probe.multiples", self.multiples, "a list of positive multiples of train.train_len, e.g. [1,2,4]")
        for length in list(self.lengths or []) + list(self.multiples):
            positive("probe.lengths" if self.lengths else "probe.multiples", length)
        if not self.depths or not all(0 <= d <= 1 for d in self.depths):
            raise PosbenchError(f"probe.depths={self.depths} must be a non-empty list of depths in [0, 1]; "
                                "valid: e.g. [0,0.5,1]")


@dataclass(frozen=True)
class Instance:
    """One trial: the asked key, its values, the distractor needles (key, value) and, per needle
    beyond the asked key's first, a draw in [0, 1) that places it in the haystack."""

    key: str
    values: tuple[int, ...]
    distractors: tuple[tuple[str, int], ...]
    places: tuple[float, ...]

    def needles(self) -> list[tuple[str, int]]:
        """The asked key's needles first, then the distractors."""
        return [(self.key, v) for v in self.values] + list(self.distractors)


def instances(cfg: NeedlesConfig) -> list[Instance]:
    rng = np.random.default_rng(cfg.seed)
    out = []
    for _ in range(cfg.trials):
        words = rng.choice(len(WORDS), cfg.keys, replace=False)
        numbers = rng.choice(np.arange(1_000_000, 10_000_000), cfg.values + cfg.keys - 1, replace=False).tolist()
        distractors = tuple((WORDS[w], n) for w, n in zip(words[1:], numbers[cfg.values:]))
        places = tuple(rng.random(cfg.values + cfg.keys - 2).tolist())
        out.append(Instance(WORDS[words[0]], tuple(numbers[:cfg.values]), distractors, places))
    return out


def answer_text(values: list[int]) -> str:
    return str(values[0]) if len(values) == 1 else ", ".join(map(str, values[:-1])) + f" and {values[-1]}"


def needles_prompt(tokenizer, length: int, depth: float, inst: Instance) -> Prompt:
    """Filler sentences cycled, the asked key's first needle at the sentence boundary nearest
    ``depth`` x (filler tokens), the other needles at boundaries drawn by ``inst.places``, then the
    question; the answer is the asked key's values in the order they appear. ``key_start``: where
    the asked key's first needle starts. Exactly ``length`` tokens with the answer but its last."""
    needles = [encode_piece(tokenizer, NEEDLE.format(key=k, value=v)) for k, v in inst.needles()]
    question = encode_piece(tokenizer, QUESTION.format(key=inst.key))
    answer_len = len(encode_piece(tokenizer, answer_text(list(inst.values))))
    for _ in range(3):  # the values' order in the text can change the answer's token count: fit again
        filler = length - (answer_len - 1) - sum(map(len, needles)) - len(question)
        if filler < 0:
            raise PosbenchError(f"probe length {length} is too short for {len(needles)} needles and the question "
                                f"({length - filler} tokens); valid: probe.lengths >= {length - filler}")
        prompt = _place(needles, question, filler, depth, inst, tokenizer)
        if len(prompt.forward_ids) == length:
            return prompt
        answer_len = len(prompt.answer)
    raise PosbenchError(f"could not fit the needles prompt to {length} tokens")  # the tokenizer is unstable


def _place(needles, question, filler: int, depth: float, inst: Instance, tokenizer) -> Prompt:
    stream, bounds = filler_stream(tokenizer, filler)
    at = [min(bounds, key=lambda b: abs(b - depth * filler))]
    at += [bounds[min(int(p * len(bounds)), len(bounds) - 1)] for p in inst.places]
    order = sorted(range(len(needles)), key=lambda i: (at[i], i))  # by place; the asked key's first needle first
    ids, last, key_start, seen = [], 0, 0, []
    for i in order:
        ids += stream[last:at[i]]
        last = at[i]
        if i == 0:
            key_start = len(ids)
        if i < len(inst.values):
            seen.append(inst.values[i])
        ids += needles[i]
    ids += stream[last:] + question
    return Prompt(ids, encode_piece(tokenizer, answer_text(seen)), key_start, filler)


class Needles(Probe):
    """A needle probe with distractors (module docstring); subclasses set the defaults."""

    key = ("length", "depth")
    metric, grid = "accuracy", "depth"
    dtypes = {"correct": "Int64"}
    Options = NeedlesConfig

    def lengths(self, train_len: int) -> list[int]:
        return ladder_lengths(self.options.lengths, self.options.multiples, train_len)

    def run(self, subject: Subject, lengths: list[int]) -> list[dict]:
        cases = instances(self.options)
        return score_cells(self.name, subject.model,
                           lambda length, depth: [needles_prompt(subject.tokenizer, length, depth, inst)
                                                  for inst in cases],
                           lengths, self.options.depths, subject.device, subject.dtype, subject.batch_tokens,
                           subject.scaling)


class NiahMultiKey(Needles):
    name = "niah_multikey"
    paper = "Hsieh et al. 2024, RULER (niah_multikey_1)"
    description = "4 needles with different keys; the value of one is asked, the others distract"
    Options = NeedlesConfig  # its defaults: 4 keys, 1 value


class NiahMultiValue(Needles):
    name = "niah_multivalue"
    paper = "Hsieh et al. 2024, RULER (niah_multivalue)"
    description = "one key with 4 values in 4 needles; all values are asked, in text order"

    @dataclass
    class Options(NeedlesConfig):
        keys: int = 1
        values: int = 4
