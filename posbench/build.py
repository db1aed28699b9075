"""From a validated config to live objects: device, autocast precision, model."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from .config import DEVICES, _choice, model_config
from .encodings import build_encoding
from .errors import PosbenchError
from .model import LanguageModel


def resolve_device(name: str) -> torch.device:
    _choice("device", name, DEVICES)
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


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def build_model(cfg: DictConfig, vocab_size: int) -> LanguageModel:
    """Model of ``cfg.model`` with encoding ``cfg.encoding``; raises PosbenchError on bad shapes."""
    mcfg = model_config(cfg.model)
    train_len = int(cfg.train.train_len)
    encoding = build_encoding(OmegaConf.to_container(cfg.encoding, resolve=True), LanguageModel.dims(mcfg, train_len, vocab_size))
    return LanguageModel(mcfg, vocab_size, encoding)
