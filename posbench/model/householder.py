"""Causal attention whose logits pass through data-dependent Householder transforms (PaTH).

Each token t carries a transform H_t = I - beta_t w_t w_t^T (w_t a unit vector of the head dim,
beta_t in (0, 2), from the encoding's ``transition`` hook), and the logit of query i and key j is

    s_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j   (j < i),      s_ii = q_i^T k_i,

then scaled, masked and normalised by softmax as any logit (Yang et al. 2025, PaTH Attention).

The pairs are computed in chunks of ``CHUNK`` tokens, as the reference's
``fla.ops.path_attn.naive.naive_path_attn`` (fla-org/flash-linear-attention) lays them out, with
one change in the loop. Inside a chunk the product of its Householder transforms has the compact
"UT" form: with L the strictly lower part of (beta w)(w)^T and T = (I + L)^-1 (here one triangular
solve; the reference loops over rows), the chunk's own pairs, its queries carried back to the
chunk's start and its keys carried on to the chunk's end are matrix products, and the whole chunk
acts on a vector as I - M with M = w^T T (beta w) (d x d). Across chunks the reference walks each
query chunk back through every earlier chunk (a loop over pairs of chunks); here the pairs are
batched instead: the loop runs over diagonals of chunk pairs, diagonal s holding every query chunk
against the keys s chunks back, all chunks at once, the queries carried back one more chunk after
each (q <- q - q M); the softmax is taken online over the diagonals (running max, sum and
weighted values, as flash attention), so no tensor grows with the loop and none is (T, T). The
work is O(T^2 d + T^2 d^2 / CHUNK), the loop T / CHUNK steps, the memory O(T CHUNK) per head.

Pure PyTorch in fp32 on every device; the reference's Triton kernels (GPU only) are not used.
``tests/test_path.py`` checks it against the transforms multiplied out token by token in float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64  # tokens per chunk (the reference's BT); the logits do not depend on it beyond rounding


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
                          chunk: int = CHUNK) -> torch.Tensor:
    """q, k, w: (B, H, T, hs), v: (B, H, T, dv); beta: (B, H, T) -> (B, H, T, dv) in v's dtype.
    ``decay``: (B, H, T) cumulative log forget gates (the logit of (i, j) gains c_i - c_j after the
    scale); ``window``: the query at i sees the keys at i - window < j <= i."""
    B, H, T, _ = q.shape
    C = min(chunk, T)
    n = -(-T // C)
    pad = n * C - T  # padded tokens: w = 0, beta = 0 (H = I), after every real token

    def chunks(x):
        return F.pad(x.float(), (0, 0, 0, pad)).view(B, H, n, C, x.shape[-1])

    intra, Q, k_end, M = chunk_terms(chunks(q), chunks(k), chunks(w),
                                     F.pad(beta.float(), (0, pad)).view(B, H, n, C), C)

    def chunk_major(x):  # (B, H, n, C, ...) -> (n, B * H, C, ...): a run of chunks is one contiguous slice
        return x.movedim(2, 0).reshape(n, B * H, *x.shape[3:]).contiguous()

    intra, Q, M = chunk_major(intra * scale), chunk_major(Q * scale), chunk_major(M)
    V = chunk_major(chunks(v))
    k_end_t = chunk_major(k_end.transpose(-1, -2))  # (n, BH, d, C)
    pos = torch.cat((positions, positions[-1] + 1 + torch.arange(pad, device=positions.device))).view(n, 1, C)
    dec = chunk_major(F.pad(decay.float(), (0, pad)).view(B, H, n, C)) if decay is not None else None

    def block_logits(logits, s):  # the pairs (query chunk c, key chunk c - s), c = s .. n - 1
        if dec is not None:
            logits = logits + dec[s:, :, :, None] - dec[:n - s, :, None, :]
        if s and not window:  # every key of an earlier chunk is seen
            return logits, False
        hidden = pos[:n - s, :, None, :] > pos[s:, :, :, None]
        if window:
            hidden = hidden | (pos[s:, :, :, None] - pos[:n - s, :, None, :] >= window)
        return logits.masked_fill(hidden, float("-inf")), bool(s and hidden.all())

    # softmax over the key chunks one diagonal at a time (online, as flash attention), every query
    # chunk at once: diagonal 0 is each chunk's own pairs, diagonal s its queries against the keys s
    # chunks back, the queries carried back one more chunk (q <- q - q M) after each
    logits, _ = block_logits(intra, 0)
    m = logits.amax(-1)  # finite: every query sees itself
    p = _exp(logits - m[..., None])
    total, acc = p.sum(-1), p @ V
    for s in range(1, n):
        logits, gone = block_logits(Q[s:] @ k_end_t[:n - s], s)
        if gone:  # a window hides this diagonal, and every later one
            break
        m_new = torch.maximum(m[s:], logits.amax(-1))
        alpha, p = _exp(m[s:] - m_new), _exp(logits - m_new[..., None])
        total = _set_tail(total, s, total[s:] * alpha + p.sum(-1))
        acc = _set_tail(acc, s, acc[s:] * alpha[..., None] + p @ V[:n - s])
        m = _set_tail(m, s, m_new)
        if s + 1 < n:
            Q = _set_tail(Q, s, Q[s:] - Q[s:] @ M[:n - s])
    out = (acc / total[..., None]).view(n, B, H, C, -1).movedim(0, 2).reshape(B, H, n * C, -1)
    return out[:, :, :T].to(v.dtype)


EXP_FLOOR = -80.0  # exp(-80) = 1.8e-35, a normal float32; exp of anything lower is as good as 0


def _exp(x: torch.Tensor) -> torch.Tensor:
    """exp(x) for x <= 0 with x floored at :data:`EXP_FLOOR`: a forget gate (``decay``) sends far
    keys' logits thousands below the row's maximum, and exp of those is a subnormal float, which
    x86 computes many times slower than a normal one (PaTH-FoX evaluated at a third of PaTH's speed
    at 16,384 tokens; exp took half its time). A floored weight is at most 1.8e-35 of the row's
    largest, so the output moves by less than float32 can show."""
    return x.clamp_min(EXP_FLOOR).exp()


def _set_tail(x: torch.Tensor, s: int, tail: torch.Tensor) -> torch.Tensor:
    """x (chunks first) with its chunks s.. replaced by ``tail``: in place without autograd (one
    buffer for the whole loop), a new tensor with it (autograd keeps each step's)."""
    if torch.is_grad_enabled():
        return torch.cat((x[:s], tail))
    x[s:] = tail
    return x
