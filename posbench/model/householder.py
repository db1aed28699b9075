"""Causal attention whose logits pass through data-dependent Householder transforms (PaTH).

Each token t carries a transform H_t = I - beta_t w_t w_t^T (w_t a unit vector of the head dim,
beta_t in (0, 2), from the encoding's ``transition`` hook), and the logit of query i and key j is

    s_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j   (j < i),      s_ii = q_i^T k_i,

then scaled, masked and normalised by softmax as any logit (Yang et al. 2025, PaTH Attention).

The pairs are computed in chunks of ``CHUNK`` tokens, as the reference's
``fla.ops.path_attn.naive.naive_path_attn`` (fla-org/flash-linear-attention) lays them out, with
one change of direction. Inside a chunk the product of its Householder transforms has the compact
"UT" form: with L the strictly lower part of (beta w)(w)^T and T = (I + L)^-1 (here one triangular
solve; the reference loops over rows), the chunk's own pairs, its queries carried back to the
chunk's start and its keys carried on to the chunk's end are matrix products, and the whole chunk
acts on a vector as I - M with M = w^T T (beta w) (d x d). Across chunks the reference walks each
query chunk back through every earlier chunk (a loop over pairs of chunks); here the keys are
walked forward instead: one state S holds every earlier key carried to the end of the last chunk
(S <- S (I - M)^T, then the chunk's own keys appended), so a query chunk meets all earlier keys in
one product and the loop runs once per chunk. The work is O(T^2 d + T^2 d^2 / CHUNK) and memory
O(T d + CHUNK T) per head: a 16k-token window needs no (T, T) matrix.

Pure PyTorch in fp32 on every device; the reference's Triton kernels (GPU only) are not used.
``tests/test_path.py`` checks it against the transforms multiplied out token by token in float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64  # tokens per chunk (the reference's BT); the logits do not depend on it beyond rounding


def _future(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int = 0) -> torch.Tensor:
    hidden = k_pos[None, :] > q_pos[:, None]
    if window:
        hidden = hidden | (q_pos[:, None] - k_pos[None, :] >= window)
    return hidden


def chunk_terms(q, k, w, beta, chunk: int):
    """q, k, w: (B, H, n, C, d) fp32 chunks, beta (B, H, n, C) -> (intra logits (B, H, n, C, C), queries
    carried to their chunk's start, keys carried to their chunk's end, each chunk's M (B, H, n, d, d))."""
    wb = w * beta[..., None]
    strict = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril(-1)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    lower = (wb @ w.transpose(-1, -2)) * strict
    T = torch.linalg.solve_triangular(eye + lower, eye.expand_as(lower), upper=False, unitriangular=True)
    twbk = T @ ((wb @ k.transpose(-1, -2)) * strict)  # (C, C): beta_t w_t . k_s for s < t, through T
    qw = (q @ w.transpose(-1, -2)).tril()  # q_t . w_s for s <= t
    twb = T @ wb
    intra = (q @ k.transpose(-1, -2)).tril() - qw @ twbk
    q_start = q - qw @ twb
    k_end = k - twbk.transpose(-1, -2) @ w
    return intra, q_start, k_end, w.transpose(-1, -2) @ twb


def householder_attention(q, k, v, w, beta, scale: float, positions: torch.Tensor, decay=None, window: int = 0,
                          bias=None, chunk: int = CHUNK) -> torch.Tensor:
    """q, k, v, w: (B, H, T, hs); beta: (B, H, T) -> (B, H, T, hs) in v's dtype. ``decay``: (B, H, T)
    cumulative log forget gates (the logit of (i, j) gains c_i - c_j after the scale); ``window``:
    the query at i sees the keys at i - window < j <= i; ``bias(q_pos, k_pos)`` -> (H, Tq, Tk), added
    after the scale."""
    B, H, T, d = q.shape
    C = min(chunk, T)
    n = -(-T // C)
    pad = n * C - T  # padded tokens: w = 0, beta = 0 (H = I), never seen by a real query

    def chunks(x):
        return F.pad(x.float(), (0, 0, 0, pad)).view(B, H, n, C, d)

    intra, q_start, k_end, M = chunk_terms(chunks(q), chunks(k), chunks(w),
                                           F.pad(beta.float(), (0, pad)).view(B, H, n, C), C)
    keys = k_end.new_zeros(B, H, 0, d)  # every earlier chunk's keys, carried to the last chunk's end
    outs = []
    for c in range(n):
        s, e = c * C, min(T, (c + 1) * C)
        logits = torch.cat((q_start[:, :, c] @ keys.transpose(-1, -2), intra[:, :, c]), dim=-1)[:, :, :e - s, :e]
        logits = logits * scale
        q_pos, k_pos = positions[s:e], positions[:e]
        if bias is not None:
            logits = logits + bias(q_pos, k_pos).float()
        if decay is not None:
            logits = logits + (decay[:, :, s:e, None] - decay[:, :, None, :e]).float()
        probs = logits.masked_fill(_future(q_pos, k_pos, window), float("-inf")).softmax(dim=-1)
        outs.append(probs.to(v.dtype) @ v[:, :, :e])
        if c + 1 < n:
            keys = torch.cat((keys - keys @ M[:, :, c].transpose(-1, -2), k_end[:, :, c]), dim=2)
    return torch.cat(outs, dim=2)
