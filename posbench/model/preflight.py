"""Preflight: estimate a job's peak memory before it starts, refuse one that cannot fit.

A training step of 32 x 100,000 tokens does not fail at once: it swaps or is killed by the
OOM killer minutes later. So ``posbench train`` (and ``posbench eval``) first add up what the
job will hold at its peak and compare it with what this machine has: available RAM on CPU
(``MemAvailable``, and the cgroup's limit when it is lower), free memory of the GPU on CUDA,
or ``POSBENCH_MEMORY_LIMIT`` gigabytes when set (a share of a machine that other jobs use).
A job over the limit is refused in one line with the estimate and the limit;
``train.preflight=false`` (training) or ``eval.preflight=false`` (evaluation) runs it anyway.

The model of memory is deliberately simple; the terms, in bytes (P parameters, N = micro-batch
x train_len tokens, D = d_model, F = d_ff, H heads, L layers, V vocabulary, a = 2 under bf16
autocast else 4):

* training state: 16 P (fp32 weights, gradients, AdamW's two moments), + 2 P bf16 weight casts;
* saved activations: N L (ACT_D D + ACT_F F) a: what autograd keeps per token and layer (the
  block's inputs, LayerNorm outputs, q, k, v, the attention output, the MLP's two hidden
  tensors), ACT_D and ACT_F set from measurements (below);
* attention (:mod:`posbench.model.attention`): the explicit kernel (short CPU training windows,
  content-dependent encodings) keeps fp32 probabilities (B, H, T, T) per layer, times the
  encoding's ``pair_cost`` for scores of its own; a bias kernel keeps one (H, T, T) mask per
  forward pass (one per layer when the bias differs by layer), or the (H, chunk, T) Toeplitz
  table; the fused kernel keeps O(T) per head, which is left out;
* the fused loss (:mod:`posbench.model.loss`): its fp32 gradient of the hidden states (N, D) and of
  the output embedding (V, D), and 1,024 x V fp32 logits per slice;
* a bias with parameters (T5, KERPLE, FIRE, ...) needs its gradient, so SDPA takes its math
  path in training and keeps about 8 bytes per (B, H, T, T) value and layer (measured);
* ``model.sinks``: the explicit kernel's fp32 logits and weights in every attention layer, as above;
* the layers of ``model.layers`` (:mod:`posbench.model.recurrent`): in training, beyond an attention
  layer's activations, SCAN_D d_model + SCAN_HKV H (K + V) fp32 values a token and layer (H heads with
  a K x V state; their projections, convolutions, fp32 casts and the scan's per-chunk products, set
  from measurements: Gated DeltaNet and Mamba-2 at 512 tokens, within 1.1x), and for Kimi Delta
  Attention's decays per key channel SCAN_CHANNEL H SUB K more (its sub-blocks' decays and
  products; 8 x 512 tokens of the tiny kkka model measured 2.32 GB); in evaluation the
  largest layer's scan per window of T tokens and head: fp32 (C, C) matrices per chunk of C tokens
  (4 C a token), the scan's inputs and solutions (2 K + 2 V a token) and the state entering each
  chunk (2 K V per chunk);
* evaluation (no gradients): 4 P (+2 P), the activations of one layer of one forward pass of
  ``eval.batch_tokens`` tokens (16 D + 2 F fp32 values a token), the chunked scores (a few
  tensors of ``ATTN_BUDGET`` fp32 values), the Toeplitz table at the longest length, and
  three 4,096 x V fp32 logit tensors of ``head_nll``.

Against the peak resident memory measured in a fresh process (``tests/test_preflight.py``,
CPU, a few shapes and kernels), the estimate is within a factor 0.5-2 of the measurement.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..encodings.extension import FUSED_BLOCK
from ..errors import PosbenchError
from ..methods import method_class
from .attention import ATTN_BUDGET, EXPLICIT_HOOKS, EXPLICIT_MAX_LEN
from .recurrent import CHUNK, SUB

ACT_D, ACT_F = 20, 3  # activation values kept per token and layer: ACT_D x d_model + ACT_F x d_ff
SCAN_D, SCAN_HKV = 48, 4  # and by a layer of model.layers beyond those: SCAN_D x d_model + SCAN_HKV x H (K + V)
SCAN_CHANNEL = 10  # and by one with decays per key channel (KDA): SCAN_CHANNEL x H x SUB x K
LOSS_ROWS, NLL_ROWS = 1024, 4096  # the fused loss's and head_nll's slices (posbench.model.loss, model.head_nll)
GB = 1e9


@dataclass
class Estimate:
    """Peak bytes of a job, by part."""
    parts: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def __str__(self) -> str:
        return f"{self.total / GB:.2f} GB (" + ", ".join(f"{k} {v / GB:.2f}" for k, v in self.parts.items()) + ")"


def _attention_train(enc, micro: int, T: int, n_layers: int, device: torch.device, act: int, chunk: int,
                     sinks: bool = False) -> float:
    hooks, heads = enc.hooks(), enc.dims.n_heads
    if (EXPLICIT_HOOKS | {"transition"}) & set(hooks) or sinks:  # explicit chunks: logits, weights, scores per layer
        return n_layers * micro * T * T * 4 * (2 * heads + enc.pair_cost())
    if "decay" in hooks:  # the (B, H, T, T) decay mask needs its gradient: the math path keeps weights and mask
        return n_layers * micro * heads * T * T * (8 + 4)
    explicit = T <= EXPLICIT_MAX_LEN and device.type == "cpu"
    probs = n_layers * micro * heads * T * T * (4 + (act if act < 4 else 0)) if explicit else 0.0
    if "bias" not in hooks:
        return probs
    rows = min(T, chunk)
    masks = 1 if enc.layer_invariant_bias else n_layers
    if not explicit and any(p.requires_grad for p in enc.parameters()):
        # a bias with parameters needs its gradient: SDPA takes its math path and keeps the
        # (B, H, T, T) weights, about 8 bytes a value per layer measured
        probs = n_layers * micro * heads * T * T * 8
    return probs + masks * heads * rows * T * max(act, 4 if explicit else act)


def scan_bytes(model, windows: int, T: int, training: bool) -> float:
    """Bytes the layers of ``model.layers`` hold for ``windows`` windows of ``T`` tokens (module
    docstring): in training, what every such layer keeps for the backward beyond an attention layer;
    in evaluation, the largest layer's scan."""
    mixers = [block.mixer for block in model.blocks if block.kind != "a"]
    shapes = [m.scan_shape() for m in mixers]
    if training:
        return float(sum(4 * windows * T * (SCAN_D * model.cfg.d_model + SCAN_HKV * h * (k + v)
                                            + (SCAN_CHANNEL * h * SUB * k if m.channel_gates else 0))
                         for m, (h, k, v) in zip(mixers, shapes)))
    return float(max(4 * windows * h * (T * (4 * CHUNK + 2 * k + 2 * v) + 2 * (T // CHUNK + 1) * k * v)
                     for h, k, v in shapes))


def train_memory(model, micro: int, T: int, device: torch.device, dtype) -> Estimate:
    """Peak bytes of one training step of ``micro`` windows of ``T`` tokens (see the module docstring)."""
    cfg, P, V = model.cfg, model.num_params(), model.vocab_size
    act = 2 if dtype == torch.bfloat16 else 4
    N = micro * T
    attention_layers = sum(block.kind == "a" for block in model.blocks)
    attention = _attention_train(model.encoding, micro, T, attention_layers, device, act, cfg.attn_chunk, cfg.sinks)
    parts = {
        "weights+grads+AdamW": 16 * P + (2 * P if act == 2 else 0),
        "activations": N * cfg.n_layers * (ACT_D * cfg.d_model + ACT_F * cfg.d_ff) * act,
        "attention": attention,
        "loss": 4 * (N * cfg.d_model + V * cfg.d_model + 2 * min(N, LOSS_ROWS) * V),
    }
    if attention_layers < cfg.n_layers:
        parts["scans"] = scan_bytes(model, micro, T, training=True)
    return Estimate(parts)


def eval_memory(model, lengths: list[int], batch_tokens: int, max_tokens: int, device: torch.device,
                dtype) -> Estimate:
    """Peak bytes of evaluating at the longest of ``lengths``, ``batch_tokens`` tokens per forward pass
    (no more windows than ``max_tokens`` scored tokens fill)."""
    cfg, P, V, enc = model.cfg, model.num_params(), model.vocab_size, model.encoding
    act = 2 if dtype == torch.bfloat16 else 4
    T = max(lengths)
    N = max(1, min(batch_tokens // T, math.ceil(max_tokens / T))) * T  # windows per forward pass
    attention = 0.0
    hooks = enc.hooks()
    if (EXPLICIT_HOOKS | {"decay", "transition"}) & set(hooks) or cfg.sinks:  # a chunk's logits, masks, sum, weights
        attention = 4 * 4 * ATTN_BUDGET
    elif "bias" in hooks:  # the Toeplitz table (or one chunk's bias) and the blocks it is built from
        attention = enc.dims.n_heads * min(T, cfg.attn_chunk) * T * act + 2 * 4 * ATTN_BUDGET
    parts = {
        "weights": 4 * P + (2 * P if act == 2 else 0),
        "activations": N * (16 * cfg.d_model + 2 * cfg.d_ff) * 4,
        "attention": attention,
        "logits": 3 * 4 * min(N, NLL_ROWS) * V,  # logits, log-softmax, and a slice of them
    }
    if any(block.kind != "a" for block in model.blocks):
        parts["scans"] = scan_bytes(model, N // T, T, training=False)
    return Estimate(parts)


def pretrained_memory(model, lengths: list[int], batch_tokens: int, max_tokens: int, extension: str = "none",
                      chunk: int = 256) -> Estimate:
    """Peak bytes of evaluating a pretrained model (:class:`posbench.model.pretrained.PretrainedLM`) at the
    longest of ``lengths``: its weights as loaded, one layer's activations of a forward pass (the
    terms above, with the model's own widths), its SDPA attention O(T) but for the keys and values
    its grouped-query heads repeat, and for an extension that moves positions (``extension``) a few
    fp32 score blocks of (heads, ``chunk``, T) per window (:func:`posbench.encodings.extension.extended_attention`),
    with, for the methods computed from their parts, the fused path's mask of (block, T) and its keys
    rotated per part."""
    config = model.model.config
    D, F = config.hidden_size, getattr(config, "intermediate_size", None) or 4 * config.hidden_size
    H, V = config.num_attention_heads, model.head.weight.shape[0]
    T = max(lengths)
    windows = max(1, min(batch_tokens // T, math.ceil(max_tokens / T)))
    N = windows * T
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    attention = 2 * N * D * 4  # keys and values repeated to every query head
    kernel = method_class(extension).kernel  # how posbench.encodings.extension computes it
    if kernel != "one":
        attention += 4 * 4 * windows * H * min(chunk, T) * T + 2 * N * D * 4  # score blocks; rotated keys
    if kernel == "parts":
        attention += 5 * min(FUSED_BLOCK, T) * T + 3 * N * D * 4  # fp32 and bool mask; keys of up to 3 parts
    return Estimate({"weights": weights, "activations": N * (16 * D + 2 * F) * 4, "attention": attention,
                     "logits": 3 * 4 * min(N, model.head_rows) * V})


def available_memory(device: torch.device) -> tuple[float, str]:
    """(bytes this job may use, what that is): free GPU memory on CUDA; else available RAM, or
    the cgroup's memory limit less its use when that is lower (containers, Slurm jobs)."""
    if os.environ.get("POSBENCH_MEMORY_LIMIT"):  # a share of a machine other jobs use too
        text = os.environ["POSBENCH_MEMORY_LIMIT"]
        try:
            return float(text) * GB, "memory set by POSBENCH_MEMORY_LIMIT"
        except ValueError:
            raise PosbenchError(f"POSBENCH_MEMORY_LIMIT={text!r} is not a number; valid: gigabytes, e.g. 8 or 0.5")
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return float(free), f"free memory of {torch.cuda.get_device_name(device)}"
    limit, what = math.inf, "available RAM"
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        limit = float(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        pass
    try:
        cap = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = float(Path("/sys/fs/cgroup/memory.current").read_text())
        if cap != "max" and float(cap) - used < limit:
            limit, what = float(cap) - used, "memory left under this cgroup's limit"
    except (OSError, ValueError):
        pass
    return limit, what


def processes_per_device(device: torch.device) -> int:
    """Ranks sharing this memory: one per GPU; on CPU every rank of this node shares the RAM."""
    return 1 if device.type == "cuda" else int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def check(estimate: Estimate, device: torch.device, job: str, valid: str, flag: str) -> None:
    """Refuse ``job`` when ``estimate`` (times the ranks sharing the memory) exceeds the limit."""
    limit, what = available_memory(device)
    need = estimate.total * processes_per_device(device)
    if need > limit:
        ranks = processes_per_device(device)
        each = f" x {ranks} processes" if ranks > 1 else ""
        raise PosbenchError(f"{job} needs about {estimate}{each}, more than the {limit / GB:.2f} GB of {what}; "
                            f"valid: {valid}, or {flag}=false to run it anyway")


def check_training(model, tcfg, micro: int, device: torch.device, dtype) -> None:
    """Refuse a training step that cannot fit (unless train.preflight=false)."""
    if tcfg.preflight:
        check(train_memory(model, micro, tcfg.train_len, device, dtype), device,
              f"a training step of {micro} windows x train.train_len={tcfg.train_len}",
              "a shorter train.train_len, or a smaller train.micro_batch_size (gradient accumulation keeps "
              "train.batch_size)", "train.preflight")


def check_pretrained(model, ecfg, lengths: list[int], device: torch.device, batch_tokens: int | None = None) -> None:
    """Refuse a pretrained model's evaluation that cannot fit at its longest length (unless
    eval.preflight=false)."""
    if ecfg.preflight:
        batch = batch_tokens or ecfg.batch_tokens
        check(pretrained_memory(model, lengths, batch, ecfg.max_tokens, ecfg.extension), device,
              f"evaluating {model.name} at length {max(lengths)} (eval.batch_tokens={batch})",
              "shorter eval.lengths, or a smaller eval.batch_tokens", "eval.preflight")


def check_evaluation(model, ecfg, lengths: list[int], device: torch.device, dtype) -> None:
    """Refuse an evaluation that cannot fit at its longest length (unless eval.preflight=false)."""
    if ecfg.preflight:
        check(eval_memory(model, lengths, ecfg.batch_tokens, ecfg.max_tokens, device, dtype), device,
              f"evaluating at eval length {max(lengths)} (eval.batch_tokens={ecfg.batch_tokens})",
              "shorter eval.lengths, or a smaller eval.batch_tokens", "eval.preflight")
