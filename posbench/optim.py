"""The optimizer and learning-rate schedule of a run: AdamW, linear warmup, cosine decay.

Its own module because training builds them and ``posbench convert`` rebuilds the optimizer to
find where each parameter's moments sit in a checkpoint.
"""

from __future__ import annotations

import math

import torch

from .config import TrainConfig


def lr_lambda(tcfg: TrainConfig):
    """Linear warmup, then cosine decay to ``min_lr_ratio`` of the peak."""
    def factor(step: int) -> float:
        if step < tcfg.warmup_steps:
            return (step + 1) / tcfg.warmup_steps
        progress = (step - tcfg.warmup_steps) / max(1, tcfg.steps - tcfg.warmup_steps)
        return tcfg.min_lr_ratio + (1 - tcfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return factor


def make_optimizer(model, tcfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; weight decay on the network's matrices (the tied token embedding included), none on
    norms, biases and every position-encoding parameter (``encoding.*``: tables, slopes, MLPs, GRU
    and convolution weights, complex's per-word tables), so an encoding's extra parameters are
    never pulled towards zero (minGPT likewise leaves its position embedding undecayed)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not name.startswith("encoding.") else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": tcfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tcfg.lr, betas=(tcfg.beta1, tcfg.beta2))
