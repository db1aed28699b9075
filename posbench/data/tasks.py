"""Algorithmic length-generalization tasks: instances made on the fly and exact answers.

Two papers measure length generalization on tasks whose answers are exact: Kazemnejad et al.
2023, "The Impact of Positional Encoding on Length Generalization in Transformers" (NeurIPS;
McGill-NLP/length-generalization: copy, reverse, addition, sorting, parity, ...) and Ruoss et
al. 2023, "Randomized Positional Encodings Boost Length Generalization of Transformers" (ACL;
deepmind/randomized_positional_encodings: reverse string, duplicate string, binary addition,
bucket sort, parity check, ...). posbench runs their tasks with the same model, encodings and
sweep machinery as its language-model ladder (``task=copy`` etc.; ``task=lm`` is the LM).

One instance of size n is one sequence ``<bos> prompt <sep> answer <eos>`` over the task's own
small vocabulary (four special tokens, then the task's symbols). Every task below has a fixed
sequence length for a given size (:meth:`Task.length`), so evaluation batches need no padding.

=========  ============================================  ======================================
task       prompt (size n)                               answer
=========  ============================================  ======================================
copy       n symbols                                     the same n symbols
reverse    n symbols                                     them in reverse order
duplicate  n symbols                                     them twice (Ruoss et al.'s duplicate string)
sort       n symbols                                     them in ascending order (bucket sort)
addition   two n-digit numbers a + b, least significant  a + b in n + 1 digits, least significant
           digit first (a's digits, ``+``, b's digits)   digit first
parity     n bits                                        1 if the count of ones is odd, else 0
recall     n key-value pairs, then one key of them       the value of that key's last pair
=========  ============================================  ======================================

Digits are written least significant first so a causal model can add with a left-to-right
carry (as the reversed-output formats of both papers' addition tasks allow). ``recall`` is
associative recall (Ba et al. 2016; Zoology's MQAR in its single-query form): keys and values
come from separate alphabets of ``symbols`` each, keys may repeat and the last pair wins.

Training (:class:`TaskSampler`): every instance's size is drawn uniformly from 1 ..
``task.train_size``; the loss is on the answer tokens and ``<eos>`` only (targets elsewhere are
``IGNORE``), as both papers train: the prompt is context, not something to predict.

Evaluation: :mod:`posbench.eval.tasks`.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import ClassVar

import torch

from ..config import TaskConfig
from ..errors import PosbenchError
from ..plugins import Registry
from .positions import draw_positions

SPECIALS = ("<pad>", "<bos>", "<sep>", "<eos>")
PAD, BOS, SEP, EOS = range(4)
IGNORE = -100  # a target the loss skips (torch's ignore_index convention)


def _randint(generator: torch.Generator, high: int, n: int) -> list[int]:
    return torch.randint(0, high, (n,), generator=generator).tolist()


class Task:
    """A task: a vocabulary of ``SPECIALS`` then ``n_symbols`` task symbols, and instances.

    The public base of every task, built-in or plugin (docs/extending.md): a subclass sets
    ``name`` and ``paper``, implements :meth:`instance` and :meth:`answer_len` (and
    :meth:`prompt_len` when the prompt is not ``size`` tokens), and every instance of one size
    must have the same length. Keyword arguments its constructor adds after ``symbols`` are its
    own options (``task.<option>=``), hashed with the run's config."""

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""

    def __init__(self, symbols: int):
        self.symbols = symbols

    @property
    def n_symbols(self) -> int:
        return self.symbols

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + self.n_symbols

    def sym(self, values: list[int]) -> list[int]:
        """Task symbol indices -> token ids."""
        return [len(SPECIALS) + v for v in values]

    def instance(self, generator: torch.Generator, size: int) -> tuple[list[int], list[int]]:
        """(prompt, answer) token ids of one instance of ``size``."""
        raise NotImplementedError

    def answer_len(self, size: int) -> int:
        raise NotImplementedError

    def prompt_len(self, size: int) -> int:
        return size

    def length(self, size: int) -> int:
        """Tokens in ``<bos> prompt <sep> answer <eos>`` at ``size``."""
        return self.prompt_len(size) + self.answer_len(size) + 3


class Copy(Task):
    name, paper = "copy", "Kazemnejad et al. 2023"

    def instance(self, generator, size):
        s = _randint(generator, self.symbols, size)
        return self.sym(s), self.sym(s)

    def answer_len(self, size):
        return size


class Reverse(Copy):
    name, paper = "reverse", "Kazemnejad et al. 2023; Ruoss et al. 2023 (reverse string)"

    def instance(self, generator, size):
        s = _randint(generator, self.symbols, size)
        return self.sym(s), self.sym(s[::-1])


class Duplicate(Task):
    name, paper = "duplicate", "Ruoss et al. 2023 (duplicate string)"

    def instance(self, generator, size):
        s = _randint(generator, self.symbols, size)
        return self.sym(s), self.sym(s + s)

    def answer_len(self, size):
        return 2 * size


class Sort(Copy):
    name, paper = "sort", "Kazemnejad et al. 2023 (sorting); Ruoss et al. 2023 (bucket sort)"

    def instance(self, generator, size):
        s = _randint(generator, self.symbols, size)
        return self.sym(s), self.sym(sorted(s))


class Addition(Task):
    """Decimal (``symbols`` = base, 10 by default) n-digit addition, least significant digit first."""

    name, paper = "addition", "Kazemnejad et al. 2023; Ruoss et al. 2023 (binary addition)"

    @property
    def n_symbols(self) -> int:
        return self.symbols + 1  # the digits, then "+"

    def __init__(self, symbols: int):
        if symbols < 2:
            raise PosbenchError(f"task.symbols={symbols} is the base of addition; valid: >= 2")
        super().__init__(symbols)

    def instance(self, generator, size):
        a, b = _randint(generator, self.symbols, size), _randint(generator, self.symbols, size)
        total, carry = [], 0
        for x, y in zip(a, b):  # least significant first
            carry, digit = divmod(x + y + carry, self.symbols)
            total.append(digit)
        return self.sym(a + [self.symbols] + b), self.sym(total + [carry])

    def prompt_len(self, size):
        return 2 * size + 1

    def answer_len(self, size):
        return size + 1


class Parity(Task):
    name, paper = "parity", "Kazemnejad et al. 2023; Ruoss et al. 2023 (parity check)"

    def __init__(self, symbols: int):
        super().__init__(2)  # bits, whatever ``symbols`` says

    def instance(self, generator, size):
        bits = _randint(generator, 2, size)
        return self.sym(bits), self.sym([sum(bits) % 2])

    def answer_len(self, size):
        return 1


class Recall(Task):
    """``symbols`` keys and ``symbols`` values (separate alphabets); n pairs, a query key, its value."""

    name, paper = "recall", "associative recall (Ba et al. 2016)"

    @property
    def n_symbols(self) -> int:
        return 2 * self.symbols

    def instance(self, generator, size):
        keys, values = _randint(generator, self.symbols, size), _randint(generator, self.symbols, size)
        query = keys[_randint(generator, size, 1)[0]]
        last = {k: v for k, v in zip(keys, values)}  # the last pair of a key wins
        pairs = [t for k, v in zip(keys, values) for t in (k, self.symbols + v)]
        return self.sym(pairs + [query]), self.sym([self.symbols + last[query]])

    def prompt_len(self, size):
        return 2 * size + 1

    def answer_len(self, size):
        return 1


class Track(Task):
    """Variable tracking, RULER's ``vt`` (Hsieh et al. 2024) as a trained task: n chains of
    ``hops`` + 1 assignments each, "x = v" then "y = x", "z = y", ..., interleaved at random (each
    chain's own assignments in order), then one chain's value; the answer is that chain's
    variables in assignment order. Each assignment is two tokens (the variable, then a value or
    the variable it copies); variables come from an alphabet of their own (``variables``, all
    different within an instance) after the ``symbols`` values, and no other chain holds the
    asked value. The zero-shot probe of the same name for pretrained models is
    ``probe=variable_tracking`` (:mod:`posbench.eval.tracking`)."""

    name, paper = "track", "variable tracking: RULER's vt (Hsieh et al. 2024)"

    def __init__(self, symbols: int, hops: int = 4, variables: int = 512):
        if symbols < 2:
            raise PosbenchError(f"task.symbols={symbols} is the number of values of track; valid: >= 2 (the asked "
                                "value and another for the other chains)")
        if hops < 1:
            raise PosbenchError(f"task.hops={hops} is not valid for track; valid: >= 1 (RULER's vt: 4)")
        super().__init__(symbols)
        self.hops, self.variables = int(hops), int(variables)

    @property
    def n_symbols(self) -> int:
        return self.symbols + self.variables  # the values, then the variables

    def instance(self, generator, size):
        k = self.hops + 1
        if size * k > self.variables:
            raise PosbenchError(f"task=track at size {size} needs {size * k} different variables; task.variables="
                                f"{self.variables}; valid: task.variables >= {size * k} (size x (hops + 1))")
        names = [self.symbols + v for v in torch.randperm(self.variables, generator=generator)[:size * k].tolist()]
        chains = [names[c * k:(c + 1) * k] for c in range(size)]
        asked = _randint(generator, self.symbols, 1)[0]
        values = [asked] + [(asked + 1 + v) % self.symbols for v in _randint(generator, self.symbols - 1, size - 1)]
        order = [[c for c in range(size) for _ in range(k)][i] for i in torch.randperm(size * k, generator=generator)]
        done, prompt = [0] * size, []
        for c in order:
            j = done[c]
            prompt += [chains[c][j], values[c] if j == 0 else chains[c][j - 1]]
            done[c] += 1
        return self.sym(prompt + [asked]), self.sym(chains[0])

    def prompt_len(self, size):
        return 2 * size * (self.hops + 1) + 1

    def answer_len(self, size):
        return self.hops + 1


def _options(cls: type[Task]) -> dict:
    """An entry-point task's config: posbench's task keys at their defaults, then the keyword
    options its constructor adds after ``symbols``."""
    keys = {f.name: getattr(TaskConfig(), f.name) for f in dataclasses.fields(TaskConfig)
            if f.name not in ("name", "target", "options")}
    return {**keys, **_own_options(cls)}


def _own_options(cls: type[Task]) -> dict:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]  # after self
    return {p.name: "???" if p.default is inspect.Parameter.empty else p.default for p in params
            if p.name != "symbols" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


TASKS = Registry("task", Task, "posbench.tasks", _options)
for _cls in (Copy, Reverse, Duplicate, Sort, Addition, Parity, Recall, Track):
    TASKS.register(_cls)
TASKS.load()


def make_task(cfg: TaskConfig) -> Task:
    """The task a config names (built-in, entry point or ``_target_``), with its own options."""
    cls = TASKS.class_of({"name": cfg.name, "_target_": cfg.target})
    own = _own_options(cls)
    unknown = sorted(set(cfg.options) - set(own))
    if unknown:
        common = [f.name for f in dataclasses.fields(TaskConfig) if f.name not in ("target", "options")]
        raise PosbenchError(f"task.{unknown[0]} is not an option of task {cfg.name!r}; valid: "
                            f"{', '.join(common)}" + (f", {', '.join(own)}" if own else ""))
    return cls(cfg.symbols, **cfg.options)


def encode(task: Task, generator: torch.Generator, sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Instances of ``sizes`` -> inputs (B, T) and targets (B, T), right-padded with ``<pad>``; a
    target is the next token where it is an answer token or ``<eos>``, else ``IGNORE``."""
    seqs, starts = [], []
    for size in sizes:
        prompt, answer = task.instance(generator, size)
        seqs.append([BOS, *prompt, SEP, *answer, EOS])
        starts.append(len(prompt) + 1)  # the input position of <sep>: it predicts the first answer token
    T = max(map(len, seqs)) - 1
    x = torch.full((len(seqs), T), PAD, dtype=torch.long)
    y = torch.full((len(seqs), T), IGNORE, dtype=torch.long)
    for i, (seq, start) in enumerate(zip(seqs, starts)):
        x[i, :len(seq) - 1] = torch.tensor(seq[:-1])
        y[i, start:len(seq) - 1] = torch.tensor(seq[start + 1:])
    return x, y


class TaskSampler:
    """Training batches of ``batch_size`` instances, sizes uniform in 1 .. train_size, drawn with its
    own generator (saved in checkpoints like :class:`posbench.data.windows.WindowSampler`'s), and with
    ``random_positions`` = L the batch's positions: a sorted random subset of [0, L)."""

    def __init__(self, task: Task, train_size: int, batch_size: int, seed: int, random_positions: int | None = None):
        self.task, self.train_size, self.batch_size = task, train_size, batch_size
        self.random_positions = random_positions
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self):
        sizes = torch.randint(1, self.train_size + 1, (self.batch_size,), generator=self.generator).tolist()
        x, y = encode(self.task, self.generator, sizes)
        return x, y, draw_positions(x.shape[1], self.random_positions, self.generator)
