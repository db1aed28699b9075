"""train(rc, run_dir): train on short windows, checkpoint, resume, then evaluate.

Re-running the same command in the same run directory resumes from
``checkpoints/last.pt``; model, optimizer, scheduler, step and every RNG state are
restored (:class:`TrainingState`, whose ``state_dict`` and ``load_state_dict`` mirror each
other), so a resumed run ends with the same numbers as an uninterrupted one.

The same function runs under torchrun or a multi-task Slurm job as data-parallel
training (see :mod:`posbench.runs.distributed`): one global batch of ``train.batch_size``
windows per step, sharded over ranks and split into ``train.micro_batch_size``
micro-batches with gradient accumulation; files are written by rank 0.

The next batch is drawn in a background thread while the current step runs, and
``train.compile=true`` runs the model under ``torch.compile``; ``auto`` (the default) where that
was measured faster (:func:`compile_policy`); ``graphs`` compiles it in torch's reduce-overhead
mode, which replays each step's forward and backward kernels as CUDA graphs: one launch where a
small model's step made hundreds, for the launch-bound runs a study puts side by side on one GPU
(possible because no step reads the GPU on the host, :class:`DeferredCheck`). How a run
trained (device, precision, eager, compiled or graphs, processes) is its rows' ``execution``
(:func:`execution`), outside the config hash.

The run config ``rc`` is built once by :func:`posbench.train.configure.train_config` (typed,
train_len fitted, a parent's hash filled in); everything here reads it, or its ``tree``.

Reading order: :func:`train` calls :func:`setup` (corpus, model, checks, resume),
:func:`run_loop` (one :func:`train_step` per step, logging and checkpoints) and
:func:`finish` (evaluation and results, rank 0).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from ..config import RunConfig, code_version
from ..encodings import PositionRangeError
from ..encodings.randomized import check_random_positions
from ..encodings.rotary import check_scalable
from ..errors import PosbenchError
from ..model import preflight
from ..model.build import autocast, autocast_dtype, build_model, keep_freed_memory, precision_name, resolve_device
from ..model.transformer import LanguageModel
from ..runs import distributed, threads
from ..runs.distributed import print0
from ..runs.kernels import KERNEL_SETTINGS
from ..runs.rundir import RunDir, atomic_write_text, load_checkpoint, remove_partial_writes, save_checkpoint
from ..runs.throughput import record
from .branch import read_branch_state
from .finetune import read_parent
from .logger import check_wandb, open_logger
from .optim import lr_lambda, make_optimizer
from .workload import Finished, Workload, check_pose, make_workload


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Prefetcher:
    """Draws the next batch in a background thread while the current step runs.

    ``consumed_state`` is the sampler generator's state after the last batch handed out,
    which is what a checkpoint must store (not the state after the batch drawn ahead)."""

    def __init__(self, sampler, pin_memory: bool = False):
        self.sampler, self.pin_memory = sampler, pin_memory
        self.consumed_state = sampler.generator.get_state()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="posbench-batches")
        self.next = self.pool.submit(self._draw)

    def _draw(self):
        x, y, positions = self.sampler()
        if self.pin_memory:
            x, y = x.pin_memory(), y.pin_memory()
        return x, y, positions, self.sampler.generator.get_state()

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        x, y, positions, self.consumed_state = self.next.result()
        self.next = self.pool.submit(self._draw)
        return x, y, positions

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def stop_on_signal():
    """Ctrl-C (SIGINT) or SIGTERM (`kill`, a cluster's preemption notice) asks the loop to stop
    after the current step (a second signal stops at once); ``requested.signum`` says which."""
    requested = threading.Event()
    requested.signum = signal.SIGINT
    if threading.current_thread() is not threading.main_thread():
        yield requested
        return

    def handler(signum, frame):
        if requested.is_set():
            raise KeyboardInterrupt
        requested.signum = signum
        requested.set()
        what = "interrupt" if signum == signal.SIGINT else signal.Signals(signum).name
        print(f"\nposbench: {what}: saving a checkpoint after this step (Ctrl-C again to abort)", file=sys.stderr)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield requested
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@torch.no_grad()
def check_train_positions(model, rc: RunConfig, device: torch.device) -> None:
    """One forward pass over ``train.train_len`` positions before training, in eval mode (no
    dropout, no random numbers drawn): an encoding that cannot represent them (a learned table
    shorter than train.train_len) fails here, before any file is written, not after the first step.
    Under ``train.pose_target`` = L_t the positions end at L_t - 1, the largest PoSE draws."""
    train_len, pose_target = rc.train.train_len, rc.train.pose_target
    model.eval()
    longest, setting = (train_len, f"train.train_len={train_len}") if pose_target is None else \
        (pose_target, f"train.pose_target={pose_target}")
    try:
        positions = None if pose_target is None else torch.arange(train_len, device=device) + (longest - train_len)
        model(torch.zeros(1, train_len, dtype=torch.long, device=device), positions=positions)
    except PositionRangeError as e:
        shorter = "a shorter train.train_len" if pose_target is None else "a smaller train.pose_target"
        valid = f"encoding.max_len >= {longest}" if "max_len" in rc.tree.encoding else shorter
        raise PosbenchError(f"{setting} is too long for encoding={rc.encoding} ({e}); valid: {valid}") from e
    finally:
        model.train()


class TrainingState:
    """Everything a checkpoint holds, and nothing else: ``state_dict`` is what is saved and
    ``load_state_dict`` restores exactly that (torchtitan's TrainState). The sampler's RNG state
    saved is the one after the last batch handed out (:attr:`Prefetcher.consumed_state`), not
    after the batch drawn ahead; each rank's torch RNG (dropout) is gathered, so every rank
    resumes its own stream."""

    def __init__(self, model, optimizer, scheduler, sampler, world, meta: dict):
        self.model, self.optimizer, self.scheduler, self.sampler = model, optimizer, scheduler, sampler
        self.world, self.meta = world, meta  # meta: config_hash, vocab_size, corpus_key
        self.step = 0
        self.batches: Prefetcher | None = None  # set once training starts drawing batches

    def state_dict(self) -> dict:
        """Collective under several processes (every rank calls it; rank 0 saves the result)."""
        sampler = self.batches.consumed_state if self.batches else self.sampler.generator.get_state()
        rng = {"torch": torch.get_rng_state(), "sampler": sampler}
        if self.world.active:
            rng["torch_ranks"] = distributed.gather_objects(torch.get_rng_state(), self.world)
        return {"step": self.step, "config_hash": self.meta["config_hash"], "vocab_size": self.meta["vocab_size"],
                "corpus_key": self.meta["corpus_key"], "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(), "rng": rng}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        ranks = state["rng"].get("torch_ranks") or [state["rng"]["torch"]]
        torch.set_rng_state(ranks[self.world.rank] if len(ranks) == self.world.size else ranks[0])
        self.sampler.generator.set_state(state["rng"]["sampler"])
        self.step = int(state["step"])


def read_resume_state(run: RunDir, chash: str, world) -> dict | None:
    """The checkpoint to resume from (None: train from scratch); refuses one of another config."""
    if world.is_main:
        remove_partial_writes(run.checkpoint)  # temp files of a process killed while checkpointing
    if not run.checkpoint.exists():
        return None
    try:
        state = load_checkpoint(run.checkpoint)
    except PosbenchError as e:
        raise PosbenchError(f"cannot resume: {e}; it is left as it is: move it away to train from scratch, "
                            "or use another hydra.run.dir") from e
    if state["config_hash"] != chash:
        raise PosbenchError(f"run dir {str(run.path)!r} holds a run with another config "
                            f"(hash {state['config_hash']} != {chash}); use another hydra.run.dir")
    return state


@dataclass
class Setup:
    """Everything the loop needs, built by :func:`setup` (every check that can fail done first)."""

    rc: RunConfig  # its tree: the encoding's options, config.yaml, the logger's config
    world: distributed.World
    device: torch.device
    dtype: torch.dtype | None
    run: RunDir
    workload: Workload
    micro: int  # windows per micro-batch
    accum: int  # micro-batches per optimizer step
    mode: str  # eager, compiled or graphs (train.compile, compile_policy)
    model: LanguageModel
    net: torch.nn.Module  # the model as stepped: DDP-wrapped and/or compiled
    ddp: torch.nn.Module
    state: TrainingState
    saved_step: int | None  # the step of the last checkpoint this process knows is on disk
    check: StepCheck  # divergence: read each step, or with a fused optimizer at log and save (DeferredCheck)

    @property
    def execution(self) -> str:
        """How the steps run (:func:`execution`): results rows and versions.json record it."""
        return execution(self.device, self.dtype, self.mode, self.world)


def setup(rc: RunConfig, run_dir) -> Setup:
    """Everything the loop needs, every check that can fail done before the first step: the run
    config's, the process group, the resume state, workload, model, optimizer, batches, memory."""
    tcfg, ecfg = rc.train, rc.eval
    check_scalable(rc.encoding, ecfg.rope_scaling)  # before hours of training, not after
    keep_freed_memory()
    micro, accum = distributed.micro_batches(tcfg.batch_size, tcfg.micro_batch_size, distributed.world())
    world, device = distributed.init(resolve_device(rc.device))
    run = RunDir(run_dir)
    resume = read_resume_state(run, rc.config_hash, world)
    if resume is None and tcfg.branch_from is not None:
        resume = read_branch_state(rc)

    dtype = autocast_dtype(device, tcfg.precision)
    compiled = compile_policy(tcfg.compile, device, dtype, tcfg.steps)
    seed_everything(rc.seed)
    workload = make_workload(rc, world.is_main)
    model = build_model(rc.tree, workload.vocab_size).to(device)
    parent = read_parent(rc, model, workload.key) if resume is None and tcfg.init_from is not None else None
    optimizer = make_optimizer(model, tcfg, fused=fused_optimizer(device))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(tcfg))
    preflight.check_training(model, tcfg, micro, device, dtype)  # before a step that cannot fit
    workload.check(model, device, dtype)
    longest = max(workload.lengths + [tcfg.train_len])
    check_random_positions(rc.encoding, tcfg.random_positions, longest, ecfg.rope_scaling)
    check_pose(model.encoding, tcfg.pose_target)
    check_train_positions(model, rc, device)
    if world.active:
        torch.manual_seed(rc.seed + world.rank)  # dropout streams differ by rank

    state = TrainingState(model, optimizer, scheduler, workload.sampler, world,
                          {"config_hash": rc.config_hash, "vocab_size": workload.vocab_size,
                           "corpus_key": workload.key})
    branched = resume is not None and resume["config_hash"] != rc.config_hash  # read_branch_state's, not ours
    if resume is not None:
        state.load_state_dict(resume)
        if branched:
            print0(f"posbench: branching off {tcfg.branch_from} at step {state.step}, the end of the stable phase "
                   "both runs share")
        else:
            print0(f"posbench: resuming {run.path} from step {state.step}")
    if parent is not None:
        changed = ", ".join(f"{len(parent[k])} {k}" for k in ("dropped", "added") if parent[k])
        print0(f"posbench: starting from the weights of {parent['dir']} (step {parent['step']}, config hash "
               f"{parent['config_hash']}){': ' + changed + ' parameters' if changed else ''}")
        for line in parent.get("adapted", []):
            print0(f"posbench: {line} (the encoding's from_parent: a learned table's positions interpolated)")
    net = ddp = model
    if world.active:
        net = ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    mode = "graphs" if tcfg.compile == "graphs" else "compiled" if compiled else "eager"
    if compiled:
        net = torch.compile(net, mode="reduce-overhead" if mode == "graphs" else None)
    return Setup(rc, world, device, dtype, run, workload, micro, accum, mode, model, net, ddp, state,
                 saved_step=state.step if resume is not None and not branched else None,
                 check=DeferredCheck() if optimizer.defaults.get("fused") else StepCheck())


def fused_optimizer(device: torch.device) -> bool:
    """Whether training steps with AdamW's fused kernel: on CUDA, where its one launch for every
    parameter replaces the foreach kernels' several, and its ``found_inf`` lets a step check for
    divergence without the host waiting on the GPU (:class:`DeferredCheck`). Not on a CPU: there
    a step's host reads cost nothing, and the foreach kernels keep the CPU runs' numbers."""
    return device.type == "cuda"


AUTO_COMPILE_MIN_STEPS = 200  # train.compile=auto compiles no shorter job: its compile time would not pay off


def has_amx() -> bool:
    """Whether this CPU has AMX tiles (bf16 matrix units), as torch reports it."""
    check = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(check and check())


def execution(device: torch.device, dtype, mode: str, world=None, environ=os.environ) -> str:
    """How a run's steps ran, as its rows record it: ``cuda bf16 graphs``, ``cpu fp32 eager``,
    ``cuda bf16 compiled, 4 processes, POSBENCH_SDPA_BIAS=cudnn``. ``mode``: eager, compiled or
    graphs; the kernel settings of the environment that were set follow (:data:`KERNEL_SETTINGS`)."""
    parts = [f"{device.type} {precision_name(dtype)} {mode}"]
    parts += [f"{world.size} processes"] if world is not None and world.active else []
    parts += [f"{k}={environ[k]}" for k in KERNEL_SETTINGS if environ.get(k)]
    return ", ".join(parts)


def compile_policy(setting: bool | str, device: torch.device, dtype, steps: int, amx: bool | None = None) -> bool:
    """Whether a training job runs under ``torch.compile``: ``train.compile`` when true or false,
    or ``graphs`` (compiled in reduce-overhead mode, CUDA graphs: refused off CUDA, where torch
    would compile without them and the rows would name what did not run);
    ``auto`` (the default) where it was measured faster than eager with the same perplexities
    (results/bench/compile.md): on a CPU with AMX training in bf16, for jobs of at least
    :data:`AUTO_COMPILE_MIN_STEPS` steps (side by side the default job trained 1.15x the tokens/s,
    1.11x in wall time with the compilation; 40-step jobs took 1.5x the wall time).
    Eager elsewhere: on a 2-core AVX2 CPU in fp32 compiled steps were 1.01-1.03x as fast, which
    its 10-20 s of compilation cancel in the default job; on AVX512-BF16 without AMX an earlier
    check found compiled steps slower; CUDA has not been measured here. The compiled and eager
    models agree to 0.01% in perplexity at every length (rope and alibi, the default job)."""
    if isinstance(setting, bool):
        return setting
    if setting == "graphs":
        if device.type != "cuda":
            raise PosbenchError(f"train.compile=graphs replays steps as CUDA graphs, which device={device.type} "
                                "has not; valid there: train.compile=true, false or auto")
        return True
    amx = has_amx() if amx is None else amx
    return device.type == "cpu" and dtype == torch.bfloat16 and amx and steps >= AUTO_COMPILE_MIN_STEPS


class Diverged(Exception):
    """A non-finite loss or gradient norm: the step stops before the weights are touched.
    ``step``: the step it happened at, where it is read later (:class:`DeferredCheck`); None:
    the step being taken."""

    def __init__(self, what: str, value: float, step: int | None = None):
        super().__init__(what)
        self.what, self.value, self.step = what, value, step


class StepCheck:
    """Divergence checked in the step that diverged: before the optimizer touches the weights,
    a non-finite loss or gradient norm raises :class:`Diverged`, so no checkpoint holds it. Each
    step reads its two figures on the host, which costs nothing on a CPU; a fused optimizer on a
    GPU reads them later (:class:`DeferredCheck`). The step calls :meth:`flag` before
    ``optimizer.step()`` and :meth:`unflag` after it; :meth:`settle` reads what is left unread
    (here nothing) before each log line and checkpoint and at the end."""

    def flag(self, optimizer, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        for what, value in (("loss", loss), ("gradient norm", grad_norm)):
            if not torch.isfinite(value):  # the weights would turn to NaN
                raise Diverged(what, value.item())

    def unflag(self, optimizer) -> None:
        pass

    def settle(self) -> None:
        pass


class DeferredCheck(StepCheck):
    """Divergence checked without a host read in the step (with a fused optimizer). Each step
    hands the fused AdamW a ``found_inf`` flag computed on the device (loss or gradient norm not
    finite), so a diverged step leaves the weights and moments as they were, exactly as torch's
    GradScaler skips a step; the step's loss and gradient norm wait on the device until
    :meth:`settle` reads them all at once, before every log line and checkpoint and at the end,
    and raises :class:`Diverged` naming the first bad step. A checkpoint is thus never written
    past a divergence, and the run stops with the same error as the checks of every step
    (:func:`train_step` without it), at most ``train.log_every`` steps later.

    Why not check each step: reading a GPU value on the host waits for every kernel queued
    before it, so the CPU cannot run ahead queueing the next step's kernels (the launch-bound
    small models of a study wait on it most)."""

    def __init__(self):
        self.pending: list[tuple[int, torch.Tensor]] = []  # (step, [loss, grad norm]) on the device

    def flag(self, optimizer, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Before ``optimizer.step()`` of step ``step``: the skip flag, and the figures kept."""
        values = torch.stack([loss.float(), grad_norm.float()])
        optimizer.found_inf = (~torch.isfinite(values).all()).float()
        self.pending.append((step, values))

    def unflag(self, optimizer) -> None:
        del optimizer.found_inf  # read by its step only

    def settle(self) -> None:
        """One host read of every pending step's figures; :class:`Diverged` at the first bad one."""
        if not self.pending:
            return
        steps = [step for step, _ in self.pending]
        values = torch.stack([v for _, v in self.pending]).tolist()
        self.pending.clear()
        for step, (loss, grad_norm) in zip(steps, values):
            for what, value in (("loss", loss), ("gradient norm", grad_norm)):
                if not math.isfinite(value):
                    raise Diverged(what, value, step)


def train_step(s: Setup, x: torch.Tensor, y: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """One optimizer step on this rank's shard of a global batch (B, T): micro-batches with
    gradient accumulation, the loss averaged over ranks, clipping, AdamW, the schedule.
    ``positions``: the batch's (T,) positions, None for 0 .. T-1. -> the step's loss, a tensor
    on the device (read on the host when a log line needs it). A non-finite loss or gradient norm
    raises :class:`Diverged` here, or with a :class:`DeferredCheck` skips the update and raises
    when read; nothing here then waits for the device."""
    x, y = distributed.shard(x, s.world), distributed.shard(y, s.world)  # (B / ranks, T)
    kwargs = {} if positions is None else {"positions": positions.to(s.device)}
    loss = torch.zeros((), device=s.device)
    for i in range(s.accum):
        xs = x[i * s.micro:(i + 1) * s.micro].to(s.device, non_blocking=True)
        ys = y[i * s.micro:(i + 1) * s.micro].to(s.device, non_blocking=True)
        # DDP averages gradients only on the last micro-batch of the step
        sync = s.ddp.no_sync() if s.world.active and i < s.accum - 1 else contextlib.nullcontext()
        with sync:
            if s.mode == "graphs":
                torch.compiler.cudagraph_mark_step_begin()  # the last replay's outputs are read: overwrite them
            with autocast(s.device, s.dtype):
                micro_loss = s.net(xs, targets=ys, **kwargs) / s.accum  # mean next-token cross-entropy
            micro_loss.backward()
        loss += micro_loss.detach()
    loss = distributed.mean(loss, s.world)
    grad_norm = torch.nn.utils.clip_grad_norm_(s.model.parameters(), s.rc.train.grad_clip)
    optimizer = s.state.optimizer
    s.check.flag(optimizer, s.state.step + 1, loss, grad_norm)
    optimizer.step()
    s.check.unflag(optimizer)
    optimizer.zero_grad(set_to_none=True)
    s.state.scheduler.step()
    return loss


def save(s: Setup, keep: bool = False) -> None:
    """Checkpoint the training state (every rank takes part; rank 0 writes) to last.pt, or with
    ``keep`` to the step's own checkpoint (``train.save_steps``), which later saves leave alone.
    Never past a divergence: the steps' unread checks are read first (:meth:`StepCheck.settle`)."""
    s.check.settle()
    state = s.state.state_dict()
    if s.world.is_main:
        save_checkpoint(s.run.step_checkpoint(s.state.step) if keep else s.run.checkpoint, state)
    if not keep:
        s.saved_step = s.state.step


def diverged_error(s: Setup, d: Diverged) -> PosbenchError:
    kept = (f"the last good checkpoint (step {s.saved_step}) is kept at {s.run.checkpoint}"
            if s.saved_step is not None else "no checkpoint was written yet")
    step = s.state.step + 1 if d.step is None else d.step
    return PosbenchError(f"{d.what} became {d.value} at step {step}; {kept}; no results were written; "
                         "valid: a lower train.lr (or check the data)")


def run_loop(s: Setup, logger, bar, interrupted) -> None:
    """Steps until ``train.steps`` or a stop signal: log every ``log_every`` steps, checkpoint every
    ``ckpt_every`` steps and at the end."""
    try:
        _steps(s, logger, bar, interrupted)
        s.check.settle()  # steps a stop signal cut off before their log line or checkpoint
    except Diverged as d:
        bar.close()  # the error is the last line printed
        raise diverged_error(s, d) from None


def _steps(s: Setup, logger, bar, interrupted) -> None:
    tcfg, state = s.rc.train, s.state
    window_loss, window_start, window_steps, window_tokens = 0.0, time.perf_counter(), 0, 0

    def stop_requested() -> bool:  # every rank stops at the same step
        flag = torch.tensor(float(interrupted.is_set()))
        return bool(distributed.mean(flag, s.world) > 0) if s.world.active else interrupted.is_set()

    while state.step < tcfg.steps and not stop_requested():
        x, y, positions = state.batches()
        loss = train_step(s, x, y, positions)
        state.step += 1
        window_loss, window_steps, window_tokens = window_loss + loss, window_steps + 1, window_tokens + x.numel()
        if state.step % tcfg.log_every == 0 or state.step == tcfg.steps:
            s.check.settle()  # a window's mean loss is read on the host: its steps' checks with it
            elapsed = time.perf_counter() - window_start
            record = {"step": state.step, "loss": float(window_loss) / window_steps,
                      "lr": state.scheduler.get_last_lr()[0], "tokens_per_s": window_tokens / elapsed,
                      "threads": torch.get_num_threads()}
            logger.log(record)
            bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}", refresh=False)
            window_loss, window_start, window_steps, window_tokens = 0.0, time.perf_counter(), 0, 0
        bar.update(1)
        threads.tick()  # idle cores looked at again every few seconds (posbench.runs.threads)
        if state.step in tcfg.save_steps:
            save(s, keep=True)
        if state.step % tcfg.ckpt_every == 0 or state.step == tcfg.steps:
            save(s)


def announce(s: Setup) -> None:
    """The run's one-line description: encoding, size, steps, process layout, device, precision."""
    tcfg, world = s.rc.train, s.world
    layout = (f" | {world.size} processes x {s.accum} micro-batches of {s.micro}"
              if world.active or s.accum > 1 else "")
    batch = s.workload.batch_text()
    print0(f"posbench: {s.rc.encoding} | {s.model.num_params() / 1e6:.2f}M params | "
           f"{tcfg.steps} steps x {batch}{layout} | {s.device} "
           f"{s.dtype or torch.float32}{'' if s.mode == 'eager' else ' | ' + s.mode}")


def finish(s: Setup, logger) -> pd.DataFrame:
    """Rank 0: the workload's evaluation, its files written and logged (the command that called
    :func:`train` draws the figures)."""
    return s.workload.evaluate(s.model, s.run, s.state.step, s.device, s.dtype, logger)


def versions(encoding, workload: Workload) -> dict:
    """What made a run, for ``versions.json`` beside its config.yaml: posbench, torch and Python,
    and for an encoding or task from outside the package, its class and the distribution that
    holds it."""
    import platform

    from ..encodings import ENCODINGS

    found = {"posbench": code_version(), "torch": torch.__version__, "python": platform.python_version()}
    if ENCODINGS.provenance(encoding.name):
        found["encoding_plugin"] = ENCODINGS.provenance(encoding.name)
    task = getattr(workload, "task", None)
    if task is not None:
        from ..data.tasks import TASKS

        if TASKS.provenance(task.name):
            found["task_plugin"] = TASKS.provenance(task.name)
    return found


def train(rc: RunConfig, run_dir) -> Finished:
    """Train ``rc`` (:func:`posbench.train.configure.train_config` of the composed config) in
    ``run_dir`` (resuming if it holds a checkpoint), evaluate, write results.

    Under several processes (torchrun, Slurm tasks) every rank calls this; rank 0 alone
    writes files and evaluates, the others get ``rows=None`` after the last step."""
    check_wandb(rc.tree)  # before the run dir gets its first file
    try:
        s = setup(rc, run_dir)
        if s.world.is_main:
            atomic_write_text(s.run.config, OmegaConf.to_yaml(rc.tree, resolve=True))
            atomic_write_text(s.run.versions,
                              json.dumps(versions(s.model.encoding, s.workload) | {"execution": s.execution},
                                         indent=1) + "\n")
        logger = open_logger(s.run, rc.tree, s.state.step, s.world.is_main)
        try:
            rows = train_and_finish(s, logger)
        finally:
            logger.close()  # a failed run still flushes what it logged
    finally:
        distributed.shutdown()
    summary = s.workload.summary(rows) if rows is not None else ""
    return Finished(s.run, rows, s.state.step, summary, s.workload.files)


def train_and_finish(s: Setup, logger):
    """The loop under the signal handlers, the stop-and-checkpoint on a signal, then rank 0's
    evaluation (None on the other ranks)."""
    s.state.batches = Prefetcher(s.state.sampler, pin_memory=s.device.type == "cuda")
    start = s.state.step
    announce(s)
    s.model.train()
    # In a terminal the bar redraws every second; in a log file (sweeps, clusters) every 30 s.
    bar = tqdm(total=s.rc.train.steps, initial=s.state.step, desc=f"train {s.rc.encoding}", file=sys.stderr,
               mininterval=1.0 if sys.stderr.isatty() else 30.0, disable=not s.world.is_main)
    try:
        with stop_on_signal() as interrupted:
            run_loop(s, logger, bar, interrupted)
            if s.state.step < s.rc.train.steps:  # stopped by Ctrl-C or SIGTERM
                save(s)
                bar.close()
                print0(f"posbench: interrupted at step {s.state.step}; checkpoint saved in {s.run.path}; "
                       "re-run the same command to resume")
                raise SystemExit(128 + interrupted.signum)
    finally:
        s.state.batches.close()
        bar.close()  # before any error line (a full disk while checkpointing)
    if not s.world.is_main:
        return None
    rows = finish(s, logger)
    if s.state.step > start and not s.world.active:  # this process trained: its speed, for plans' estimates
        record(s.run.path, str(s.rc.tree.model.name), s.model.num_params(), s.rc.encoding, s.rc.train.train_len,
               str(s.device), precision_name(s.dtype), layers=s.model.cfg.layers)
    return rows
