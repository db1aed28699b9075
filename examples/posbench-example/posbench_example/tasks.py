"""A task written the way a researcher would add their own to posbench.

``Increment`` is declared as an entry point in pyproject.toml (``task=increment``) and named by
``_target_`` in ``examples/config/task/add_constant.yaml`` (``--config-dir examples/config
task=add_constant``, which sets its own option ``step``). It subclasses posbench's public
``Task``: a name, an instance of each size, and the answer's length.
"""

from __future__ import annotations

import torch

from posbench.data.tasks import Task


class Increment(Task):
    """An n-digit number (least significant digit first) -> the number plus ``step``, in n + 1
    digits: one carry chain across the whole prompt, so the answer's last digit depends on
    every digit of the prompt."""

    paper = "example plugin; cf. Kazemnejad et al. 2023 (addition)"

    def __init__(self, symbols: int, step: int = 1):
        super().__init__(symbols)
        self.step = step

    def instance(self, generator: torch.Generator, size: int) -> tuple[list[int], list[int]]:
        digits = torch.randint(0, self.symbols, (size,), generator=generator).tolist()
        value = sum(d * self.symbols ** i for i, d in enumerate(digits)) + self.step
        out = [(value // self.symbols ** i) % self.symbols for i in range(size + 1)]
        return self.sym(digits), self.sym(out)

    def answer_len(self, size: int) -> int:
        return size + 1
