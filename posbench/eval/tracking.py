"""Variable tracking: RULER's multi-hop probe, chains of assignments hidden in a haystack.

Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language Models?"
(NVIDIA/RULER, ``scripts/data/synthetic/variable_tracking.py``, task ``vt``): a chain of
assignments "VAR QPWKD = 47211", "VAR MZLTA = VAR QPWKD", "VAR BXRUE = VAR MZLTA", ... is
hidden in a haystack, and the model is asked for every variable that holds the chain's value.
Passkey and the needles ask for one sentence found by its words; here each hop of the chain
has to be followed from the variable named by the one before, so a model that can only copy
from a matching key cannot answer past the first name.

As in RULER (``vt``: num_chains=1, num_hops=4, the noise haystack): each chain is
``probe.hops`` + 1 variables of 5 random uppercase letters, all different across the chains;
its first assignment gives a 5-digit value (10000..99998) and each next one copies the variable
before it; each chain's assignments appear in chain order; the question and the answer prefix
are RULER's ("Question: Find all variables that are assigned the value {value} in the text
above. Answer: According to the chain(s) of variable assignment in the text above, {n}
variables are assigned the value {value}, they are:"); with ``probe.chains`` > 1 the value of
the first chain is asked and the other chains, with values of their own, distract; the answer
is the asked chain's names joined by spaces (RULER's few-shot answer, ``" ".join(outputs)``).

Differences, for base LMs and exact scoring:

* the haystack is the passkey filler (:func:`posbench.eval.passkey.filler_stream`: its five
  sentences cycled and cut to an exact token count, joined by spaces, as the needles probes
  do), where RULER repeats the whole five-sentence string once per line; the assignments are
  joined by spaces too, so each ends with "." (as in RULER's essay haystack) where RULER's
  noise haystack ends it with a newline;
* the opening instruction ("Memorize and track the chain(s) of variable assignment hidden in
  the following text.") and RULER's one in-context example are left out, as for passkey;
* names and values come from a numpy generator seeded by ``probe.seed`` (RULER: Python's
  ``random`` and numpy's global state), and the chains' values all differ (RULER may repeat
  one, which makes the question ambiguous);
* placement: RULER has no depth; it puts each chain's assignments at random sentence
  positions through the whole haystack, at least one filler sentence apart. Here the asked
  chain's first assignment starts at the filler sentence boundary nearest ``depth`` x (filler
  tokens), and its other assignments at seeded random boundaries at or after that one (drawn
  uniformly from those boundaries and sorted, so a few may be adjacent; at depth 1 the whole
  chain sits right before the question); a distracting chain's assignments go, sorted, at
  seeded random boundaries of the whole filler. At one boundary the asked chain comes first
  and each chain keeps its order. The draws are fractions of the boundaries, so an instance
  is the same at every length and depth;
* scoring: the answer's tokens are read by teacher forcing, in chain order, as for the needles
  (:func:`posbench.eval.passkey.score_cells`): ``accuracy``, greedy decoding gives the whole
  answer, and ``logprob``, the mean log-probability of its tokens. RULER generates and scores
  the fraction of the chain's names found in the output, in any order.

A row at length L uses exactly L positions: the prompt plus the answer's tokens but the last.
:class:`VariableTracking` is the probe registered as ``variable_tracking``
(:mod:`posbench.eval.probes`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import PosbenchError
from .passkey import PasskeyConfig, Prompt, filler_stream, score_cells
from .probe import Probe, Subject, encode_piece

FIRST = "VAR {name} = {value}."
HOP = "VAR {name} = VAR {previous}."
QUESTION = ("Question: Find all variables that are assigned the value {value} in the text above. "
            "Answer: According to the chain(s) of variable assignment in the text above, {count} variables "
            "are assigned the value {value}, they are:")
NAME_LETTERS = 5  # RULER's variable names: 5 uppercase letters


@dataclass
class TrackingConfig(PasskeyConfig):
    """The variable-tracking probe's options (conf/probe/variable_tracking.yaml): passkey's
    lengths, multiples, depths (where the asked chain starts), trials and seed (names, values
    and places: the same at every length and depth), checked the same way, and RULER's
    num_chains and num_hops."""

    chains: int = 1  # chains of assignments: the asked one and chains - 1 distractors
    hops: int = 4  # assignments after each chain's first: hops + 1 variables hold the value

    def __post_init__(self):
        super().__post_init__()
        for name in ("chains", "hops"):
            value = getattr(self, name)
            if not value >= 1:
                raise PosbenchError(f"probe.{name}={value} is not a positive integer; valid: 1, 2, ... "
                                    "(RULER's vt: chains=1, hops=4)")


@dataclass(frozen=True)
class Instance:
    """One trial: per chain, its variable names in assignment order and its value (the first
    chain is asked), and sorted draws in [0, 1) that place its assignments: ``hops`` for the
    asked chain (its first is placed by depth), ``hops + 1`` for each distractor."""

    names: tuple[tuple[str, ...], ...]
    values: tuple[int, ...]
    places: tuple[tuple[float, ...], ...]

    def assignments(self) -> list[list[str]]:
        """Each chain's assignment sentences, in chain order."""
        return [[FIRST.format(name=chain[0], value=value)]
                + [HOP.format(name=name, previous=previous) for previous, name in zip(chain, chain[1:])]
                for chain, value in zip(self.names, self.values)]

    def answer(self) -> str:
        return " ".join(self.names[0])

    def question(self) -> str:
        return QUESTION.format(value=self.values[0], count=len(self.names[0]))


def variable_names(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` different names of :data:`NAME_LETTERS` uppercase letters."""
    names: list[str] = []
    while len(names) < n:
        name = "".join(chr(ord("A") + int(c)) for c in rng.integers(0, 26, NAME_LETTERS))
        if name not in names:
            names.append(name)
    return names


def instances(cfg: TrackingConfig) -> list[Instance]:
    rng = np.random.default_rng(cfg.seed)
    out = []
    for _ in range(cfg.trials):
        flat = variable_names(rng, cfg.chains * (cfg.hops + 1))
        names = tuple(tuple(flat[c * (cfg.hops + 1):(c + 1) * (cfg.hops + 1)]) for c in range(cfg.chains))
        values = tuple(rng.choice(np.arange(10_000, 99_999), cfg.chains, replace=False).tolist())
        places = tuple(tuple(sorted(rng.random(cfg.hops + (c > 0)).tolist())) for c in range(cfg.chains))
        out.append(Instance(names, values, places))
    return out


def tracking_prompt(tokenizer, length: int, depth: float, inst: Instance) -> Prompt:
    """Filler sentences cycled with the chains' assignments between them (module docstring),
    then the question; ``key_start``: where the asked chain's first assignment starts. Exactly
    ``length`` tokens with the answer but its last (:attr:`Prompt.forward_ids`)."""
    pieces = [[encode_piece(tokenizer, s) for s in chain] for chain in inst.assignments()]
    question, answer = encode_piece(tokenizer, inst.question()), encode_piece(tokenizer, inst.answer())
    filler = length - (len(answer) - 1) - sum(len(p) for chain in pieces for p in chain) - len(question)
    if filler < 0:
        raise PosbenchError(f"probe length {length} is too short for {sum(map(len, pieces))} assignments, the "
                            f"question and the answer ({length - filler} tokens); "
                            f"valid: probe.lengths >= {length - filler}")
    stream, bounds = filler_stream(tokenizer, filler)
    first = min(bounds, key=lambda b: abs(b - depth * filler))
    after = [b for b in bounds if b >= first]
    at = [[first] + [after[min(int(p * len(after)), len(after) - 1)] for p in inst.places[0]]]
    at += [[bounds[min(int(p * len(bounds)), len(bounds) - 1)] for p in places] for places in inst.places[1:]]
    # by place; at one boundary the asked chain first, each chain in its order (its places are sorted)
    order = sorted((b, c, j) for c, chain in enumerate(at) for j, b in enumerate(chain))
    ids, last, key_start = [], 0, 0
    for b, c, j in order:
        ids += stream[last:b]
        last = b
        if (c, j) == (0, 0):
            key_start = len(ids)
        ids += pieces[c][j]
    ids += stream[last:] + question
    return Prompt(ids, answer, key_start, filler)


class VariableTracking(Probe):
    """RULER's variable tracking (module docstring): accuracy by length and depth of the chain."""

    name = "variable_tracking"
    paper = "Hsieh et al. 2024, RULER (vt)"
    description = "chains of variable assignments hidden in filler; all variables holding one value are asked"
    key = ("length", "depth")
    metric, grid = "accuracy", "depth"
    dtypes = {"correct": "Int64"}
    Options = TrackingConfig

    def run(self, subject: Subject, lengths: list[int]) -> list[dict]:
        cases = instances(self.options)
        return score_cells(self.name, subject.model,
                           lambda length, depth: [tracking_prompt(subject.tokenizer, length, depth, inst)
                                                  for inst in cases],
                           lengths, self.options.depths, subject.device, subject.dtype, subject.batch_tokens,
                           subject.scaling)
