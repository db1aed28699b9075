"""From a validated config to live objects: device, autocast precision, model."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from ..config import DEVICES, choice, model_config
from ..encodings import REGISTRY, build_encoding, saved_options
from ..errors import PosbenchError
from .transformer import LanguageModel


def keep_freed_memory() -> bool:
    """Let glibc keep freed memory for reuse instead of handing it back to the OS.

    By default glibc serves large blocks with mmap and unmaps them on free, so each training
    step maps its activations afresh and the kernel zero-fills every new page on first
    touch. With no mmap (M_MMAP_MAX 0) and a 1 GiB trim threshold, every step reuses the
    previous step's pages; training and evaluation both get faster (``posbench bench`` measures
    each allocator, results/bench/). Evaluation's long-context chunks come longest first
    (:func:`posbench.model.attention._chunks`) so the heap is reused rather than fragmented.

    Returns whether it applied (glibc on Linux); ``POSBENCH_SYSTEM_MALLOC=1`` leaves malloc alone."""
    if os.environ.get("POSBENCH_SYSTEM_MALLOC") == "1" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl, ...)
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 1 << 30))


def resolve_device(name: str) -> torch.device:
    choice("device", name, DEVICES)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise PosbenchError("device=cuda but no CUDA GPU is visible; valid choices here: auto, cpu")
    return torch.device(name)


def _cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def autocast_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """bf16 where the hardware runs it natively (CUDA with bf16, CPUs with AVX512-BF16/AMX)."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    supported = torch.cuda.is_bf16_supported() if device.type == "cuda" else _cpu_has_bf16()
    return torch.bfloat16 if supported else None


def precision_name(dtype: torch.dtype | None) -> str:
    """The ``train.precision`` that :func:`autocast_dtype` resolved to: bf16, or fp32 (no autocast)."""
    return "bf16" if dtype == torch.bfloat16 else "fp32"


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def encoding_options(cfg: DictConfig) -> dict:
    """``cfg.encoding`` as keyword arguments, a saved run's former defaults filled in. Under
    ``train.random_positions`` = L positions reach L - 1 (:mod:`posbench.encodings.randomized`): a position
    table (``max_len``, whose YAML default already reads L) set to null gets L entries, and one
    set shorter is a PosbenchError."""
    options = saved_options(OmegaConf.to_container(cfg.encoding, resolve=True))  # older run dirs: former defaults
    max_position = cfg.train.get("random_positions")
    cls = REGISTRY.get(options.get("name"))
    if max_position is None or cls is None or "max_len" not in cls.params():
        return options
    if options.get("max_len") is None:
        return {**options, "max_len": int(max_position)}
    if int(options["max_len"]) < int(max_position):
        raise PosbenchError(f"encoding.max_len={options['max_len']} cannot hold the positions of "
                            f"train.random_positions={max_position}; valid: encoding.max_len=null or >= {max_position}")
    return options


def build_model(cfg: DictConfig, vocab_size: int) -> LanguageModel:
    """Model of ``cfg.model`` with encoding ``cfg.encoding``; raises PosbenchError on bad shapes."""
    mcfg = model_config(cfg.model)
    train_len = int(cfg.train.train_len)
    encoding = build_encoding(encoding_options(cfg), LanguageModel.dims(mcfg, train_len, vocab_size))
    if "embed_scale" not in cfg.model:  # a run trained before model.embed_scale: its encoding chose
        mcfg.embed_scale = "sqrt_d" if encoding.scale_token_embedding else "none"
    return LanguageModel(mcfg, vocab_size, encoding)
