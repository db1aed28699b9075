"""Algorithmic tasks, evaluated: exact match and per-token accuracy by size (the tasks
themselves and their training sampler: :mod:`posbench.data.tasks`).

Evaluation (:func:`evaluate_task`): ``task.eval_instances`` fresh instances of size exactly
m x train_size for each m in ``task.eval_multiples``, drawn from a generator seeded by
``task.eval_seed`` and the size (not the run's seed): every encoding and seed is scored on the
same instances, so differences between them are paired. Teacher-forced in one forward pass:
an instance is an exact match when the arg-max prediction of every answer token and of
``<eos>`` is right, which is exactly when greedy decoding after ``<sep>`` reproduces the answer
and stops; per-token accuracy is the teacher-forced fraction of those tokens right.
Intervals: Wilson's 95% interval for exact match, a t interval over instances for per-token
accuracy (docs/tasks.md).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..config import TaskConfig
from ..data.positions import draw_positions
from ..data.tasks import IGNORE, Task, encode, make_task
from ..intervals import t_interval, wilson_interval
from ..model.build import autocast
from .results import TASK_COLUMNS


@torch.no_grad()
def score_size(model, task: Task, tcfg: TaskConfig, size: int, device, dtype, random_positions=None):
    """(exact (N,) bool, token accuracy (N,) float) of ``eval_instances`` fresh instances of ``size``."""
    generator = torch.Generator().manual_seed(tcfg.eval_seed * 1_000_003 + size)
    exact, token = [], []
    for start in range(0, tcfg.eval_instances, tcfg.eval_batch):
        n = min(tcfg.eval_batch, tcfg.eval_instances - start)
        x, y = encode(task, generator, [size] * n)
        positions = draw_positions(x.shape[1], random_positions, generator)
        x, y = x.to(device), y.to(device)
        kwargs = {} if positions is None else {"positions": positions.to(device)}
        with autocast(device, dtype):
            hidden = model.hidden(x, **kwargs)
        keep = y != IGNORE
        answer_len = int(keep[0].sum())
        h = hidden[keep].float()  # (n * answer_len, D) in instance order
        pred = (h @ model.tok_emb.weight.float().t()).argmax(-1).view(n, answer_len)
        right = (pred == y[keep].view(n, answer_len)).cpu()
        exact.append(right.all(dim=1))
        token.append(right.float().mean(dim=1))
    return torch.cat(exact).numpy(), torch.cat(token).numpy()


def size_row(exact: np.ndarray, token: np.ndarray) -> dict:
    """One size's metrics and 95% intervals (Wilson for exact match, t over instances for tokens)."""
    n = len(exact)
    lo, hi = wilson_interval(int(exact.sum()), n)[1:3]
    if n > 1 and token.std() > 0:
        ti = t_interval(token)
        t_lo, t_hi = max(0.0, ti.low), min(1.0, ti.high)
    else:  # every instance scored the same: no spread to estimate
        t_lo = t_hi = float(token.mean())
    return {"instances": n, "exact_match": float(exact.mean()), "exact_lo": lo, "exact_hi": hi,
            "token_acc": float(token.mean()), "token_sd": float(token.std(ddof=1)) if n > 1 else 0.0,
            "token_lo": t_lo, "token_hi": t_hi}


def evaluate_task(model, tcfg: TaskConfig, meta: dict, device, dtype, random_positions=None) -> pd.DataFrame:
    """tasks.csv rows (``TASK_COLUMNS``): every size m x train_size of ``tcfg.eval_multiples``.
    ``meta``: encoding, seed, step, config_hash."""
    from tqdm.auto import tqdm

    task = make_task(tcfg)
    model.eval()
    rows = []
    for m in tqdm(tcfg.eval_multiples, desc=f"eval {tcfg.name}", leave=False, disable=None):
        size = m * tcfg.train_size
        exact, token = score_size(model, task, tcfg, size, device, dtype, random_positions)
        rows.append({"task": tcfg.name, "random_positions": int(random_positions or 0), "train_size": tcfg.train_size,
                     "eval_size": size, "multiple": m, "params": model.num_params(), **meta,
                     **size_row(exact, token)})
    return pd.DataFrame(rows)[TASK_COLUMNS]


LEARNED = 0.5  # exact match at the training size below which a run is told it has not learned its task


def unlearned_note(rows: pd.DataFrame) -> str | None:
    """One line when exact match at the training size (1x) is below :data:`LEARNED`: accuracy
    beyond the training size then says little about length generalization. None otherwise."""
    at = rows[rows.multiple == 1]
    if at.empty or float(at.exact_match.iloc[0]) >= LEARNED:
        return None
    r = at.iloc[0]
    return (f"note: exact match at the training size ({r.task}, n={r.eval_size}) is {r.exact_match:.1%}, below "
            f"{LEARNED:.0%}: the model has not learned the task, so accuracy at longer sizes says little about "
            "length generalization; train longer (train.steps) or start from experiment=tasks_quick")


def markdown_tasks(rows: pd.DataFrame) -> str:
    """A run's tasks.csv as a Markdown table (exact match and per-token accuracy with intervals),
    followed by :func:`unlearned_note` where it applies."""
    lines = ["| task | encoding | size | multiple | exact match [95% CI] | token acc [95% CI] | instances |",
             "|---|---|---|---|---|---|---|"]
    for r in rows.itertuples():
        lines.append(f"| {r.task} | {r.encoding} | {r.eval_size} | {r.multiple}x | {r.exact_match:.1%} "
                     f"[{r.exact_lo:.1%}, {r.exact_hi:.1%}] | {r.token_acc:.1%} [{r.token_lo:.1%}, {r.token_hi:.1%}] "
                     f"| {r.instances} |")
    note = unlearned_note(rows)
    return "\n".join(lines + ([f"\n{note}"] if note else []))
