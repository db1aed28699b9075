"""What a run trains on and how it is scored: the language-model ladder or an algorithmic task.

Both implement one small interface, so the trainer and the commands never ask which one they
hold (torchtitan's ``Validator``, lm-evaluation-harness' ``Task``):

===================  ==========================================  ======================================
                     :class:`LanguageModelling` (``task=lm``)    :class:`AlgorithmicTask` (``task=copy``...)
===================  ==========================================  ======================================
``sampler``          windows of train_len tokens of the corpus   instances of sizes 1 .. train_size
``vocab_size``       the corpus's BPE vocabulary                 the task's symbols and specials
``key``              the corpus cache key (checkpoints hold it)  ``task:<name>``
``lengths``          eval.lengths (1x .. 16x train_len)          the sequence length of each size
``results_file``     results.csv (+ positions.csv, token NLL)    tasks.csv
``evaluate``         the perplexity ladder                       exact match and token accuracy by size
``summary``          the Markdown table of perplexities          the Markdown table of accuracies
===================  ==========================================  ======================================
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from omegaconf import DictConfig, open_dict

from ..config import RunConfig, task_config
from ..data.corpus import Corpus, load_corpus
from ..data.positions import pose_positions
from ..data.windows import OnceSampler, WindowSampler, mix
from ..encodings import PositionEncoding
from ..encodings.randomized import position_readers
from ..errors import PosbenchError
from ..eval.ladder import extension_of, perplexity_ladder, result_rows, rows_to_compute, unigram_perplexity
from ..eval.results import backfill, markdown_results, read_results, write_results
from ..eval.subject import scaling_label
from ..eval.token_set import scored_count, scored_tokens
from ..model.preflight import check_evaluation
from ..runs.rundir import RunDir, atomic_write_text


@dataclass
class Finished:
    """What :func:`posbench.train.loop.train` hands back to the command that called it."""

    run: RunDir
    rows: pd.DataFrame | None  # None on ranks other than 0, which do not evaluate
    steps: int
    summary: str = ""  # the Markdown table a command prints
    files: str = ""    # what the run dir holds, for the command's last line


class LanguageModelling:
    """The corpus: train on windows, evaluate perplexity at every length of the ladder."""

    results_file = "results.csv"
    files = "results.csv, ppl_vs_length.png, metrics.jsonl, config.yaml"

    def __init__(self, rc: RunConfig, log=print):
        tcfg = rc.train
        self.rc = rc
        self.corpus: Corpus = load_corpus(rc.data, log=log)
        self.vocab_size, self.key = self.corpus.vocab_size, self.corpus.meta["key"]
        if tcfg.sampler == "once":
            self.sampler = OnceSampler(self.corpus.splits["train"], tcfg.train_len, tcfg.batch_size, rc.seed,
                                       tcfg.random_positions, steps=tcfg.steps)
        else:
            self.sampler = WindowSampler(self.corpus.splits["train"], tcfg.train_len, tcfg.batch_size, rc.seed,
                                         tcfg.random_positions)
        self.lengths = rc.eval.resolve_lengths(tcfg.train_len)

    def batch_text(self) -> str:
        return f"{self.rc.train.batch_size * self.rc.train.train_len} tokens"

    def check(self, model, device: torch.device, dtype) -> None:
        """Fail before training, not after: enough evaluation tokens, and memory for the ladder."""
        ecfg = self.rc.eval
        scored_tokens(self.corpus.splits[ecfg.split], self.lengths, ecfg.max_tokens, ecfg.split)
        check_evaluation(model, ecfg, self.lengths, device, dtype)

    def evaluate(self, model, run: RunDir, step: int, device, dtype, logger) -> pd.DataFrame:
        """Perplexity at every length results.csv lacks for this model (a finished run re-run
        computes none, and leaves results.csv as it was) -> results.csv (and positions.csv,
        token_nll.npz), logged. -> every row of results.csv."""
        ecfg, tree = self.rc.eval, self.rc.tree
        tokens = self.corpus.splits[ecfg.split]
        ext = extension_of(ecfg, self.rc.train.train_len)
        # the whole ladder's count, or the token set the run's rows score already (a later eval may have moved it)
        n = scored_count(run.results, tokens, self.lengths, ecfg, scaling_label(ecfg.rope_scaling, ext), False)
        _, todo = rows_to_compute(run, tree, ecfg, self.lengths, n, ext, step=step)
        if todo:
            ladder = perplexity_ladder(model, tokens, todo, ecfg, device, dtype, tokenizer=self.corpus.tokenizer,
                                       n_tokens=n, random_positions=self.rc.train.random_positions, ext=ext,
                                       unigram=unigram_perplexity(self.corpus.splits["train"], tokens[1:n + 1]))
            rows = write_results(run, result_rows(tree, ladder, step, run.execution()))
        else:
            rows = backfill(read_results(run.results))
        logger.finish(rows)
        return rows

    def summary(self, rows: pd.DataFrame) -> str:
        return markdown_results(rows)


class AlgorithmicTask:
    """An algorithmic task: train on fresh instances, evaluate accuracy at multiples of the
    training size (:mod:`posbench.data.tasks`, :mod:`posbench.eval.tasks`)."""

    results_file = "tasks.csv"
    files = "tasks.csv, metrics.jsonl, config.yaml"

    def __init__(self, rc: RunConfig):
        from ..data.tasks import TaskSampler, make_task

        self.rc, self.corpus = rc, None
        self.task = make_task(rc.task)
        self.vocab_size, self.key = self.task.vocab_size, f"task:{rc.task.name}"
        self.sampler = TaskSampler(self.task, rc.task.train_size, rc.train.batch_size, rc.seed,
                                   rc.train.random_positions)
        self.lengths = [self.task.length(m * rc.task.train_size) for m in rc.task.eval_multiples]

    def batch_text(self) -> str:
        return f"{self.rc.train.batch_size} {self.rc.task.name} instances of sizes 1..{self.rc.task.train_size}"

    def check(self, model, device: torch.device, dtype) -> None:
        pass  # instances are made on the fly; the longest is checked with the model's positions

    def evaluate(self, model, run: RunDir, step: int, device, dtype, logger) -> pd.DataFrame:
        """Exact match and per-token accuracy at every size -> tasks.csv."""
        from ..eval.tasks import evaluate_task

        rc = self.rc
        meta = {"encoding": rc.encoding, "seed": rc.seed, "step": step, "config_hash": rc.config_hash}
        rows = evaluate_task(model, rc.task, meta, device, dtype, rc.train.random_positions)
        atomic_write_text(run.path / self.results_file, rows.to_csv(index=False))
        return rows

    def summary(self, rows: pd.DataFrame) -> str:
        from ..eval.tasks import markdown_tasks

        return markdown_tasks(rows)


Workload = LanguageModelling | AlgorithmicTask


def make_workload(rc: RunConfig, is_main: bool = True) -> Workload:
    """The run's workload (``task=lm``: the corpus; else the task). Every rank draws the same
    global batch (same seed) and keeps its shard. Under ``train.pose_target`` its sampler's
    batches get PoSE's position ids (:class:`PoseSampler`)."""
    if rc.task.is_lm:
        workload = LanguageModelling(rc, log=print if is_main else (lambda *a, **k: None))
    else:
        workload = AlgorithmicTask(rc)
    if rc.train.pose_target is not None:
        workload.sampler = PoseSampler(workload.sampler, rc.train.pose_target, rc.seed)
    return workload


POSE_SALT = 2  # PoSE's generator seed is mix(seed, 0, POSE_SALT): a stream apart from the windows'


class Streams:
    """Several generators answering as one, as the trainer asks a sampler's ``generator``
    (``get_state``/``set_state``, a checkpoint's sampler state): the list of their states."""

    def __init__(self, *generators):
        self.generators = generators

    def get_state(self) -> list:
        return [g.get_state() for g in self.generators]

    def set_state(self, state) -> None:
        if not isinstance(state, list | tuple) or len(state) != len(self.generators):
            raise PosbenchError("the checkpoint's sampler state is not that of a train.pose_target run (the states "
                                "of its windows and of its positions); valid: resume with the settings it was "
                                "trained with")
        for generator, part in zip(self.generators, state):
            generator.set_state(part)


class PoseSampler:
    """A workload's sampler with PoSE's position ids (``train.pose_target`` = L_t; Zhu et al. 2024,
    :func:`posbench.data.positions.pose_positions`): the same windows or instances as without the
    setting, each batch's positions drawn for its length from a generator of their own.

    One draw serves the whole batch, as for randomized positions: every encoding hook takes one
    (T,) position vector. The reference draws chunk lengths and skips per example; over a run the
    draws cover the same range, each step with one of them."""

    def __init__(self, sampler, target: int, seed: int):
        self.sampler, self.target = sampler, target
        self.positions = torch.Generator().manual_seed(mix(seed, 0, salt=POSE_SALT))
        self.generator = Streams(sampler.generator, self.positions)

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, y, _ = self.sampler()
        return x, y, pose_positions(x.shape[1], self.target, self.positions)


def fit_train_len(cfg: DictConfig) -> None:
    """A task run's ``train.train_len`` is its longest training sequence, set from the task (the
    encodings size their tables by it) before the config is hashed, so config.yaml and the
    config hash record it. The language model keeps the train_len it was given. Written into
    ``cfg``: the copy :func:`posbench.train.configure.fitted` makes."""
    tc = task_config(cfg.get("task"))
    if tc.is_lm:
        return
    import torch

    from ..data.tasks import make_task

    task = make_task(tc)
    largest = max(tc.eval_multiples, default=1) * tc.train_size
    task.instance(torch.Generator().manual_seed(0), largest)  # a size the task cannot make: one line, before training
    with open_dict(cfg):
        cfg.train.train_len = task.length(tc.train_size)


def check_later_evaluation(run_config: DictConfig, run_dir) -> None:
    """``posbench eval`` (the ladder, a probe) measures a language model on its corpus; a task
    run is evaluated when it is trained: one line saying so."""
    tc = task_config(run_config.get("task"))
    if not tc.is_lm:
        raise PosbenchError(f"checkpoint={run_dir} is a task run (task={tc.name}): posbench eval measures a "
                            "language model on its corpus; a task run is evaluated at the end of posbench train: "
                            "re-run its train command (task.eval_multiples / task.eval_instances may change) to "
                            "evaluate again")


def check_pose(encoding: PositionEncoding, target: int | None) -> None:
    """A one-line PosbenchError when ``train.pose_target`` = ``target`` would change nothing: the
    model's encoding reads no position values (NoPE, FoX without RoPE, ...). Nothing when
    ``target`` is None."""
    if target is not None and not encoding.reads_positions:
        raise PosbenchError(f"train.pose_target={target} has no effect on encoding={encoding.name}, which reads no "
                            f"positions; valid: encodings that read positions: {', '.join(position_readers())}")
