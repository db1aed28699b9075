"""A training run's config, finished and typed once where the run starts: :func:`train_config`.

The composed Hydra config lacks two values only the train stage can work out, and the config
hash covers both: an algorithmic task's ``train.train_len`` (its longest training sequence, from
the task: :func:`posbench.train.workload.fit_train_len`) and a fine-tuned run's
``train.init_hash`` and ``train.init_len`` (from its parent's config.yaml:
:func:`posbench.train.finetune.set_parent_hash`). :func:`train_config` fills them into a copy
(the caller's config is left as it was), types and hashes it (:func:`posbench.config.run_config`)
and keeps the finished tree, resolved and read-only, as the result's ``tree``. ``posbench train``
builds it once and hands it to :func:`posbench.train.loop.train`; nothing below reads the raw
config. The few readers that need the tree itself (the encoding's options for the model,
config.yaml, the logger's config, a parent's or a branch source's shape) read ``rc.tree``.

It belongs to the train stage, not to :mod:`posbench.config`: fitting builds the task (torch),
and the parent's hash reads a run dir. ``posbench study`` hashes a sweep from :func:`fitted`, the
same fitting, so the hash it looks for is the one the run will write.
"""

from __future__ import annotations

import copy

from omegaconf import DictConfig, OmegaConf

from ..config import RunConfig, run_config
from .finetune import set_parent_hash
from .workload import fit_train_len


def fitted(cfg: DictConfig) -> DictConfig:
    """A copy of ``cfg`` with a task run's ``train.train_len`` fitted to the task (a language
    model's left as given): everything the config hash covers but a parent's hash."""
    tree = copy.deepcopy(cfg)
    fit_train_len(tree)
    return tree


def train_config(cfg: DictConfig) -> RunConfig:
    """The run config of ``posbench train`` with ``cfg``: train_len fitted, the parent's hash and
    train_len filled in (``train.init_from``), typed and validated, ``tree`` the finished config
    resolved and read-only. ``cfg`` itself is not changed. Its errors, one line each, come in this
    order: the task's sizes, the parent, then each section in :func:`~posbench.config.run_config`'s order."""
    tree = fitted(cfg)
    set_parent_hash(tree)  # train.init_from's config hash, which this run's hash covers
    rc = run_config(tree)  # each section typed (its errors in their order) and hashed
    OmegaConf.resolve(tree)  # in place: the values config.yaml records and the hash covers
    OmegaConf.set_readonly(tree, True)
    rc.tree = tree  # the object run_config kept, now finished
    return rc
