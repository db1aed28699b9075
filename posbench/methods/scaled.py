"""log-n and Llama 3's RoPE scaling: every pair at its trained positions, one fused attention."""

from __future__ import annotations

import torch

from .base import Extension, logn_factor


class LogN(Extension, name="logn"):
    """**log-n** (Chiang & Cholak 2022; Qwen's ``use_logn_attn``): q times max(1, log_{L} (i + 1)),
    so attention stays as sharp over more keys; the factor is :func:`logn_factor`, the one
    posbench's own models train with (``model.length_scaling=logn``, :mod:`posbench.model.length_scaling`)."""

    paper = "Chiang & Cholak 2022; Qwen's use_logn_attn"

    sets_positions = False

    def identity_at(self, length: int) -> bool:
        return length <= self.train_len

    def query_scale(self, i: torch.Tensor) -> torch.Tensor:
        return logn_factor(i + 1, self.train_len)


class Llama3(Extension, name="llama3"):
    """**llama3** (Meta 2024, "The Llama 3 Herd of Models"; ``apply_scaling`` in meta-llama/llama-models,
    Hugging Face ``rope_type: llama3``): every pair as trained, on new frequencies
    (:func:`llama3_inv_freq`). s is ``factor``, or max(1, T / L) per window when None (as
    ``eval.rope_factor`` null for the RoPE scalings). On a model whose own config already scales its
    RoPE, it scales the frequencies the model has."""

    paper = "Meta 2024, The Llama 3 Herd of Models; meta-llama/llama-models apply_scaling"

    moves = "frequencies"

    @property
    def label(self) -> str:
        """``llama3``, or ``llama3(s=8)`` at a fixed factor."""
        return "llama3" if self.factor is None else f"llama3(s={self.factor:g})"

    def identity_at(self, length: int) -> bool:
        return length <= self.train_len if self.factor is None else self.factor == 1

    def frequencies(self, inv_freq: torch.Tensor, T: int) -> torch.Tensor:
        from . import llama3_inv_freq  # the formula of eval.rope_scaling=llama3 (posbench.methods.rope)

        s = self.factor if self.factor is not None else max(1.0, T / self.train_len)
        return llama3_inv_freq(inv_freq, s, self.train_len)
