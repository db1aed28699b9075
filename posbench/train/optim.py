"""The optimizer and learning-rate schedule of a run: AdamW, linear warmup, then cosine decay
(``train.schedule=cosine``, the default), warmup-stable-decay (``wsd``), or the peak held to the
end (``constant``: the recalibration of DroPE's reference, :mod:`posbench.train.finetune`).

Warmup-stable-decay (Zhai et al. 2022; Hu et al. 2024, MiniCPM; Hägele et al. 2024, "Scaling
Laws and Compute-Optimal Training Beyond Fixed Training Durations") holds the peak learning rate
until the last ``decay_frac`` of the steps, then cools it down to ``min_lr_ratio`` of the peak
along 1 - sqrt(progress), the cooldown Hägele et al. found best. Its point for posbench: runs of
different lengths share every step before their decay, so a short run can branch off a long
one's stable phase (:mod:`posbench.train.branch`) and a budget study costs the longest run plus the
short decays, not the sum of all runs.

Its own module because training builds them and ``posbench convert`` rebuilds the optimizer to
find where each parameter's moments sit in a checkpoint.
"""

from __future__ import annotations

import math

import torch

from ..config import TrainConfig
from ..model.transformer import OWN_PARAMETERS


def lr_lambda(tcfg: TrainConfig):
    """The factor on the peak learning rate before optimizer step ``step + 1``: linear warmup,
    then cosine decay to ``min_lr_ratio`` of the peak (``cosine``), the peak (``constant``), or the peak held until
    :meth:`TrainConfig.decay_start` and a 1 - sqrt cooldown to ``min_lr_ratio`` (``wsd``)."""
    start = tcfg.decay_start()

    def factor(step: int) -> float:
        if step < tcfg.warmup_steps:
            return (step + 1) / tcfg.warmup_steps
        if tcfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - start) / max(1, tcfg.steps - start))
        if tcfg.schedule == "wsd":
            return 1.0 if progress <= 0 else 1 - (1 - tcfg.min_lr_ratio) * math.sqrt(progress)
        return tcfg.min_lr_ratio + (1 - tcfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def make_optimizer(model, tcfg: TrainConfig, fused: bool = False) -> torch.optim.Optimizer:
    """AdamW; weight decay on the network's matrices (the tied token embedding included), none on
    norms, biases and every position-encoding parameter (``encoding.*``: tables, slopes, MLPs, GRU
    and convolution weights, complex's per-word tables), so an encoding's extra parameters are
    never pulled towards zero (minGPT likewise leaves its position embedding undecayed), nor SSMax's
    scales (``length_scaling.s``). ``fused``: torch's fused kernel (one launch for every parameter,
    and a ``found_inf`` tensor that skips a step without the host reading it;
    :func:`posbench.train.loop.fused_optimizer` says where); else torch's default (foreach)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not name.startswith(OWN_PARAMETERS) else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": tcfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tcfg.lr, betas=(tcfg.beta1, tcfg.beta2), **({"fused": True} if fused else {}))
