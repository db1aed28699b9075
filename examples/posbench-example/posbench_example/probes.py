"""A probe written the way a researcher would add their own to posbench.

``Repeat`` is declared as an entry point in pyproject.toml (``posbench eval probe=repeat
checkpoint=<run>``) and named by ``_target_`` in ``examples/config/probe/repeat_far.yaml``. It
subclasses posbench's public ``Probe``: its options as a dataclass, and :meth:`run`, which gets
the model under test (a :class:`posbench.eval.probe.Subject`) and the lengths to probe and
returns one row per length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from posbench.encodings import PositionRangeError
from posbench.eval.probe import Probe, Subject


class Repeat(Probe):
    """Random tokens, then the same tokens again: can the model copy from half a window back?

    At length L the input is a random sequence of L/2 token ids repeated once (an induction
    test, Olsson et al. 2022). Teacher-forced, ``accuracy`` is the fraction of the second copy's
    tokens (after its first) predicted by the arg-max: a model that reads the first copy scores
    near 1 at every length its attention reaches, one that cannot scores near 1/vocab.
    """

    paper = "example plugin; cf. Olsson et al. 2022 (induction heads)"
    description = "random tokens repeated once; accuracy of predicting the repeat"
    key = ("length",)
    metric = "accuracy"

    @dataclass
    class Options:
        lengths: list[int] | None = None  # tokens per input; None: multiples x train_len
        multiples: list[int] = field(default_factory=lambda: [1, 2, 4])
        trials: int = 4  # random sequences per length
        seed: int = 0

    @torch.no_grad()
    def run(self, subject: Subject, lengths: list[int]) -> list[dict]:
        vocab = subject.tokenizer.get_vocab_size()
        generator = torch.Generator().manual_seed(self.options.seed)
        rows = []
        for length in lengths:
            half = length // 2
            first = torch.randint(0, vocab, (self.options.trials, half), generator=generator)
            x = torch.cat([first, first], dim=1).to(subject.device)  # (trials, 2 * half)
            try:
                with subject.scaling(2 * half), subject.autocast():
                    logits = subject.model(x[:, :-1])
            except PositionRangeError as e:
                rows.append({"length": length, "trials": self.options.trials, "accuracy": float("nan"),
                             "status": f"n/a: {e}"})
                continue
            right = logits[:, half:].argmax(-1) == x[:, half + 1:]  # predictions of the second copy
            rows.append({"length": length, "trials": self.options.trials, "accuracy": right.float().mean().item(),
                         "status": "ok"})
        return rows
