"""train(cfg, run_dir): train on short windows, checkpoint, resume, then evaluate.

Re-running the same command in the same run directory resumes from
``checkpoints/last.pt``; model, optimizer, scheduler, step and every RNG state are
restored, so a resumed run ends with the same numbers as an uninterrupted one.

The same function runs under torchrun or a multi-task Slurm job as data-parallel
training (see :mod:`posbench.distributed`): one global batch of ``train.batch_size``
windows per step, sharded over ranks and split into ``train.micro_batch_size``
micro-batches with gradient accumulation; files are written by rank 0.

The next batch is drawn in a background thread while the current step runs, and
``train.compile=true`` runs the model under ``torch.compile``.
"""

from __future__ import annotations

import contextlib
import math
import random
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from . import distributed, preflight
from .build import autocast, autocast_dtype, build_model, keep_freed_memory, resolve_device
from .checkpoint import RunDir, atomic_write_text, load_checkpoint, remove_partial_writes, save_checkpoint
from .config import DataConfig, EvalConfig, TrainConfig, config_hash, typed
from .data import load_corpus
from .encodings import PositionRangeError
from .encodings.rotary import check_scalable
from .errors import PosbenchError
from .evaluate import perplexity_ladder, result_rows, scored_tokens
from .learned_bias import write_run_figure
from .logger import MetricsLogger
from .results import write_results


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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


class WindowSampler:
    """Random (B, T+1) windows from one token array, driven by its own generator."""

    def __init__(self, tokens: np.ndarray, train_len: int, batch_size: int, seed: int):
        if tokens.size <= train_len + 1:
            raise PosbenchError(f"train.train_len={train_len} needs more than {train_len + 1} train tokens; "
                                f"the corpus has {tokens.size}; valid: train.train_len <= {tokens.size - 2}")
        self.tokens = torch.from_numpy(tokens.astype(np.int64))
        self.offsets = torch.arange(train_len + 1)
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        high = self.tokens.numel() - self.offsets.numel() + 1
        starts = torch.randint(0, high, (self.batch_size,), generator=self.generator)
        windows = self.tokens[starts[:, None] + self.offsets[None, :]]  # (B, T+1)
        return windows[:, :-1], windows[:, 1:]


class Prefetcher:
    """Draws the next batch in a background thread while the current step runs.

    ``consumed_state`` is the sampler generator's state after the last batch handed out,
    which is what a checkpoint must store (not the state after the batch drawn ahead)."""

    def __init__(self, sampler: WindowSampler, pin_memory: bool = False):
        self.sampler, self.pin_memory = sampler, pin_memory
        self.consumed_state = sampler.generator.get_state()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="posbench-batches")
        self.next = self.pool.submit(self._draw)

    def _draw(self):
        x, y = self.sampler()
        if self.pin_memory:
            x, y = x.pin_memory(), y.pin_memory()
        return x, y, self.sampler.generator.get_state()

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y, self.consumed_state = self.next.result()
        self.next = self.pool.submit(self._draw)
        return x, y

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
def check_train_positions(model, cfg: DictConfig, train_len: int, device: torch.device) -> None:
    """One forward pass over ``train_len`` positions before training, in eval mode (no dropout,
    no random numbers drawn): an encoding that cannot represent them (a learned table shorter
    than train.train_len) fails here, before any file is written, not after the first step."""
    model.eval()
    try:
        model(torch.zeros(1, train_len, dtype=torch.long, device=device))
    except PositionRangeError as e:
        valid = f"encoding.max_len >= {train_len}" if "max_len" in cfg.encoding else "a shorter train.train_len"
        raise PosbenchError(f"train.train_len={train_len} is too long for encoding={cfg.encoding.name} "
                            f"({e}); valid: {valid}") from e
    finally:
        model.train()


def lm_loss(net, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``net`` (the model, or its DDP / compiled wrapper)."""
    return net(x, targets=y)


def train(cfg: DictConfig, run_dir) -> dict:
    """Train ``cfg`` in ``run_dir`` (resuming if it holds a checkpoint), evaluate, write results.

    Under several processes (torchrun, Slurm tasks) every rank calls this; rank 0 alone
    writes files and evaluates, the others return ``results=None`` after the last step."""
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int):
        raise PosbenchError(f"seed must be an integer, got {cfg.seed!r}; valid: e.g. seed=0 (seed=0,1,2 with -m)")
    tcfg = typed(TrainConfig, cfg.train, "train")
    ecfg = typed(EvalConfig, cfg.eval, "eval")
    typed(DataConfig, cfg.data, "data")
    check_scalable(str(cfg.encoding.name), ecfg.rope_scaling)  # before hours of training, not after
    keep_freed_memory()
    world = distributed.world()
    micro, accum = distributed.micro_batches(tcfg.batch_size, tcfg.micro_batch_size, world)
    world, device = distributed.init(resolve_device(str(cfg.device)))
    run = RunDir(run_dir)
    chash = config_hash(cfg)
    state = None
    if world.is_main:
        remove_partial_writes(run.checkpoint)  # temp files of a process killed while checkpointing
    if run.checkpoint.exists():
        try:
            state = load_checkpoint(run.checkpoint)
        except PosbenchError as e:
            raise PosbenchError(f"cannot resume: {e}; it is left as it is: move it away to train from scratch, "
                                "or use another hydra.run.dir") from e
        if state["config_hash"] != chash:
            raise PosbenchError(f"run dir {str(run.path)!r} holds a run with another config "
                                f"(hash {state['config_hash']} != {chash}); use another hydra.run.dir")

    seed_everything(int(cfg.seed))
    corpus = load_corpus(cfg.data, log=print if world.is_main else (lambda *a, **k: None))
    lengths = ecfg.resolve_lengths(tcfg.train_len)
    model = build_model(cfg, corpus.vocab_size).to(device)
    dtype = autocast_dtype(device, tcfg.precision)
    optimizer = make_optimizer(model, tcfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(tcfg))
    # Every rank draws the same global batch (same seed) and keeps its own shard of it.
    sampler = WindowSampler(corpus.splits["train"], tcfg.train_len, tcfg.batch_size, int(cfg.seed))
    preflight.check_training(model, tcfg, micro, device, dtype)  # before a step that cannot fit
    scored_tokens(corpus.splits[ecfg.split], lengths, ecfg.max_tokens, ecfg.split)  # fail before training
    preflight.check_evaluation(model, ecfg, lengths, device, dtype)
    check_train_positions(model, cfg, tcfg.train_len, device)
    if world.active:
        torch.manual_seed(int(cfg.seed) + world.rank)  # dropout streams differ by rank

    step = 0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        ranks = state["rng"].get("torch_ranks") or [state["rng"]["torch"]]
        torch.set_rng_state(ranks[world.rank] if len(ranks) == world.size else ranks[0])
        sampler.generator.set_state(state["rng"]["sampler"])
        step = int(state["step"])
        if world.is_main:
            print(f"posbench: resuming {run.path} from step {step}", file=sys.stderr)
    net = model
    if world.active:
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    ddp = net
    if tcfg.compile:
        net = torch.compile(net)
    logger = None
    if world.is_main:
        atomic_write_text(run.config, OmegaConf.to_yaml(cfg, resolve=True))
        logger = MetricsLogger(run, cfg, resume_step=step)
    batches = Prefetcher(sampler, pin_memory=device.type == "cuda")

    def checkpoint():
        rng = {"torch": torch.get_rng_state(), "sampler": batches.consumed_state}
        if world.active:
            rng["torch_ranks"] = distributed.gather_objects(torch.get_rng_state(), world)
        if world.is_main:
            save_checkpoint(run.checkpoint, {
                "step": step, "config_hash": chash, "vocab_size": corpus.vocab_size,
                "corpus_key": corpus.meta["key"], "model": model.state_dict(),
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng})

    tokens_per_step = tcfg.batch_size * tcfg.train_len
    if world.is_main:
        layout = (f" | {world.size} processes x {accum} micro-batches of {micro}" if world.active or accum > 1 else "")
        print(f"posbench: {cfg.encoding.name} | {model.num_params() / 1e6:.2f}M params | "
              f"{tcfg.steps} steps x {tokens_per_step} tokens{layout} | {device} {dtype or torch.float32}"
              f"{' | compiled' if tcfg.compile else ''}", file=sys.stderr)
    model.train()
    # In a terminal the bar redraws every second; in a log file (sweeps, clusters) every 30 s.
    bar = tqdm(total=tcfg.steps, initial=step, desc=f"train {cfg.encoding.name}", file=sys.stderr,
               mininterval=1.0 if sys.stderr.isatty() else 30.0, disable=not world.is_main)
    window_loss, window_start, window_steps = 0.0, time.perf_counter(), 0
    saved_step = step if state is not None else None  # the last checkpoint on disk

    def diverged(what: str, value: float) -> PosbenchError:
        bar.close()  # the error is the last line printed
        kept = (f"the last good checkpoint (step {saved_step}) is kept at {run.checkpoint}" if saved_step is not None
                else "no checkpoint was written yet")
        return PosbenchError(f"{what} became {value} at step {step + 1}; {kept}; no results were written; "
                             "valid: a lower train.lr (or check the data)")

    def stop_requested() -> bool:  # every rank stops at the same step
        flag = torch.tensor(float(interrupted.is_set()))
        return bool(distributed.mean(flag, world) > 0) if world.active else interrupted.is_set()

    try:
        with stop_on_signal() as interrupted:
            while step < tcfg.steps and not stop_requested():
                x, y = batches()
                x, y = distributed.shard(x, world), distributed.shard(y, world)  # (B / ranks, T)
                loss = torch.zeros((), device=device)
                for i in range(accum):
                    xs = x[i * micro:(i + 1) * micro].to(device, non_blocking=True)
                    ys = y[i * micro:(i + 1) * micro].to(device, non_blocking=True)
                    # DDP averages gradients only on the last micro-batch of the step
                    sync = ddp.no_sync() if world.active and i < accum - 1 else contextlib.nullcontext()
                    with sync:
                        with autocast(device, dtype):
                            micro_loss = lm_loss(net, xs, ys) / accum
                        micro_loss.backward()
                    loss += micro_loss.detach()
                loss = distributed.mean(loss, world)
                if not torch.isfinite(loss):
                    raise diverged("loss", loss.item())
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
                if not torch.isfinite(grad_norm):  # would turn the weights to NaN in the next checkpoint
                    raise diverged("gradient norm", grad_norm.item())
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()
                step += 1
                window_loss, window_steps = window_loss + loss.item(), window_steps + 1
                if step % tcfg.log_every == 0 or step == tcfg.steps:
                    elapsed = time.perf_counter() - window_start
                    record = {"step": step, "loss": window_loss / window_steps, "lr": scheduler.get_last_lr()[0],
                              "tokens_per_s": window_steps * tokens_per_step / elapsed}
                    if logger is not None:
                        logger.log(record)
                    bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}", refresh=False)
                    window_loss, window_start, window_steps = 0.0, time.perf_counter(), 0
                bar.update(1)
                if step % tcfg.ckpt_every == 0 or step == tcfg.steps:
                    checkpoint()
                    saved_step = step
            if step < tcfg.steps:  # stopped by Ctrl-C or SIGTERM
                checkpoint()
                bar.close()
                if world.is_main:
                    print(f"posbench: interrupted at step {step}; checkpoint saved in {run.path}; "
                          "re-run the same command to resume", file=sys.stderr)
                raise SystemExit(128 + interrupted.signum)
    finally:
        batches.close()
        bar.close()  # before any error line (a full disk while checkpointing)
    if not world.is_main:
        return {"run_dir": str(run.path), "results": None, "steps": step}

    from .report import draw_run

    ladder = perplexity_ladder(model, corpus.splits[ecfg.split], lengths, ecfg, device, dtype,
                               tokenizer=corpus.tokenizer)
    rows = write_results(run, result_rows(cfg, ladder, step), draw=lambda merged: draw_run(run, merged))
    write_run_figure(model.encoding, run.path)  # learned_bias.png/.svg where the bias is learned
    logger.finish(rows)
    return {"run_dir": str(run.path), "results": rows, "steps": step}
