"""Causal attention kernels, picked by the hooks an encoding overrides.

* no ``bias``/``score`` hook: fused ``scaled_dot_product_attention`` (flash on GPU);
* ``bias``: fused SDPA with the bias as a float mask, in query chunks so that at
  most (H, chunk, T) bias entries exist at once rather than (H, T, T);
* ``score``/``value``: explicit softmax attention in query chunks (memory linear in T).

Positions are always ``arange(T)``, so a query chunk [s, e) only sees keys [0, e).
When the whole sequence is one chunk (training lengths) and the encoding's bias does
not depend on the layer, the masked bias is built once per forward pass and shared
by all layers through ``cache``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .encodings import PositionEncoding


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enc: PositionEncoding,
                     positions: torch.Tensor, layer: int, chunk_size: int = 1024,
                     cache: dict | None = None) -> torch.Tensor:
    """q, k, v: (B, H, T, hs) -> (B, H, T, hs). ``cache``: a dict living for one forward pass."""
    hooks = enc.hooks()
    if "score" in hooks or "value" in hooks:
        return _explicit_chunks(q, k, v, enc, positions, layer, chunk_size)
    if "bias" in hooks:
        if cache is not None and enc.layer_invariant_bias and q.shape[2] <= chunk_size:
            if "bias" not in cache:
                cache["bias"] = _masked_bias(enc, positions, positions, layer, q.dtype)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=cache["bias"], scale=enc.logit_scale())
        return _sdpa_bias_chunks(q, k, v, enc, positions, layer, chunk_size)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=enc.logit_scale())


def _future(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    return k_pos[None, :] > q_pos[:, None]  # (Tq, Tk) True where j > i


def _masked_bias(enc, q_pos, k_pos, layer, dtype) -> torch.Tensor:
    bias = enc.bias(q_pos, k_pos, layer).float()  # (H, Tq, Tk)
    return bias.masked_fill(_future(q_pos, k_pos), float("-inf")).to(dtype)[None]


def _sdpa_bias_chunks(q, k, v, enc, positions, layer, chunk_size):
    outs = []
    for start in range(0, q.shape[2], chunk_size):
        end = min(q.shape[2], start + chunk_size)
        mask = _masked_bias(enc, positions[start:end], positions[:end], layer, q.dtype)
        outs.append(F.scaled_dot_product_attention(
            q[:, :, start:end], k[:, :, :end], v[:, :, :end], attn_mask=mask, scale=enc.logit_scale()))
    return torch.cat(outs, dim=2)


def _explicit_chunks(q, k, v, enc, positions, layer, chunk_size):
    hooks, scale = enc.hooks(), enc.logit_scale()
    outs = []
    for start in range(0, q.shape[2], chunk_size):
        end = min(q.shape[2], start + chunk_size)
        q_pos, k_pos = positions[start:end], positions[:end]
        qc, kc, vc = q[:, :, start:end], k[:, :, :end], v[:, :, :end]
        logits = (qc @ kc.transpose(-2, -1)).float()  # (B, H, Tq, Tk)
        if "score" in hooks:
            logits = logits + enc.score(qc, kc, q_pos, k_pos, layer).float()
        logits = logits * scale
        if "bias" in hooks:
            logits = logits + enc.bias(q_pos, k_pos, layer).float()
        probs = logits.masked_fill(_future(q_pos, k_pos), float("-inf")).softmax(dim=-1)
        out = probs.to(vc.dtype) @ vc
        if "value" in hooks:
            out = out + enc.value(probs, q_pos, k_pos, layer).to(out.dtype)
        outs.append(out)
    return torch.cat(outs, dim=2)


def reference_attention(q, k, v, enc: PositionEncoding, positions: torch.Tensor, layer: int = 0):
    """Plain full-matrix attention in fp32, for tests comparing kernels."""
    return _explicit_chunks(q.float(), k.float(), v.float(), enc, positions, layer,
                            chunk_size=q.shape[2])
