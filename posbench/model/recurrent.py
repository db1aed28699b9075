"""Layers that are not softmax attention: Gated DeltaNet, Kimi Delta Attention and Mamba-2, in plain PyTorch.

Both keep a fixed-size state per head that each token updates; neither reads positions (a token's
place enters only through the order of the updates), so a model mixing them with attention
layers (``model.layers``) takes its position information from the attention layers' encoding and
from the recurrence itself.

**One scan for both.** With a state S (K x V) per head, a log forget gate g_t <= 0, and optional
delta-rule strengths beta_t, the layers compute (o_t the output of query q_t)

    S_t = exp(g_t) S_{t-1} + k_t u_t^T,    o_t = S_t^T q_t,
    u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t)     (Gated DeltaNet: the gated delta rule)
    u_t = v_t                                       (Mamba-2's SSD: q = C, k = B, v = dt x, g = dt A)

:func:`recurrent_scan` runs it token by token: the reference, as flash-linear-attention's
``naive_recurrent_gated_delta_rule`` writes it. :func:`chunk_scan` computes the same in chunks of
C tokens, the form the paper's kernels use (Yang, Kautz & Hatamizadeh 2025; Yang et al. 2024,
"Parallelizing Linear Transformers with the Delta Rule over Sequence Length"): within a chunk,
with gamma_r the cumulative gate from the chunk's start and S_0 the state entering it,

    u_r = beta_r (v_r - exp(gamma_r) S_0^T k_r - sum_{s<r} exp(gamma_r - gamma_s) (k_r . k_s) u_s),

a unit lower-triangular system (I + A) U = diag(beta) V - diag(beta exp(gamma)) K S_0, solved once
for every chunk at the same time as U = U0 - W S_0 (two triangular solves), so the loop over
chunks is matrix products only:

    O = diag(exp(gamma)) Q S_0 + (Q K^T * M) U,   M_rs = exp(gamma_r - gamma_s) for s <= r, else 0,
    S_C = exp(gamma_C) S_0 + (K * exp(gamma_C - gamma))^T U.

Every exponent is <= 0, so nothing overflows; the scan runs in fp32 (autocast off). Memory is
linear in T: (C, C) matrices per chunk and head, and one state per head.

On CUDA with ``POSBENCH_FLA=1`` the layers call flash-linear-attention's Triton kernels instead
(``chunk_gated_delta_rule``, and ``chunk_simple_gla`` for Mamba-2's scan: the same recurrence with
no delta rule), the package the issue's references ship (``fla-core``); tests/test_gpu.py checks
them equal to :func:`chunk_scan` where a GPU and the package are present. Off by default: the
plain scan is the one every shipped row used.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import nn

CHUNK = 64  # tokens per chunk of chunk_scan
SUB = 8  # tokens per sub-block of channel_chunk_scan (Kimi Delta Attention's per-channel decays)
FLA = os.environ.get("POSBENCH_FLA") == "1"  # read once, at import: flash-linear-attention's kernels on CUDA


def scan(q, k, v, g, beta=None):
    """The layers' scan: :func:`chunk_scan`, or on CUDA with ``POSBENCH_FLA=1`` :func:`fla_scan`."""
    if FLA and q.is_cuda:
        return fla_scan(q, k, v, g, beta)
    return chunk_scan(q, k, v, g, beta)


def fla_scan(q, k, v, g, beta=None):
    """:func:`chunk_scan` by flash-linear-attention's kernels (layout (B, T, H, .), scale 1: the layers
    scale q themselves), in q's dtype. -> (o (B, H, T, V), final state (B, H, K, V))."""
    heads_second = lambda t: t.transpose(1, 2).contiguous().to(q.dtype)  # noqa: E731
    if g.dim() == 4:  # a gate per key channel: Kimi Delta Attention's kernel
        from fla.ops.kda import chunk_kda

        o, state = chunk_kda(heads_second(q), heads_second(k), heads_second(v), heads_second(g),
                             heads_second(beta), scale=1.0, output_final_state=True)
    elif beta is None:
        from fla.ops.simple_gla import chunk_simple_gla

        o, state = chunk_simple_gla(heads_second(q), heads_second(k), heads_second(v), g=heads_second(g),
                                    scale=1.0, output_final_state=True)
    else:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        o, state = chunk_gated_delta_rule(heads_second(q), heads_second(k), heads_second(v), heads_second(g),
                                          heads_second(beta), scale=1.0, output_final_state=True)
    return o.transpose(1, 2).to(v.dtype), state


def recurrent_scan(q, k, v, g, beta=None, state=None):
    """The recurrence token by token. q, k: (B, H, T, K); v: (B, H, T, V); g: (B, H, T) log gates,
    or (B, H, T, K), one per key channel (KDA's Diag(alpha_t)); beta: (B, H, T) or None (no delta
    rule). -> (o (B, H, T, V), final state (B, H, K, V))."""
    B, H, T, K = q.shape
    S = q.new_zeros(B, H, K, v.shape[-1]) if state is None else state
    out = []
    for t in range(T):
        S = S * (g[:, :, t].exp()[..., None] if g.dim() == 4 else g[:, :, t].exp()[..., None, None])
        u = v[:, :, t]
        if beta is not None:
            u = beta[:, :, t, None] * (u - torch.einsum("bhkv,bhk->bhv", S, k[:, :, t]))
        S = S + k[:, :, t, :, None] * u[:, :, None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, :, t]))
    return torch.stack(out, dim=2), S


def _in_chunks(chunk: int, *tensors):
    """Each of ``tensors`` (B, H, T, ...), or None, zero-padded at the end of T to a multiple of
    ``chunk`` (later tokens change no earlier output) and viewed as (B, H, n, chunk, ...)."""
    T = tensors[0].shape[2]
    pad = -T % chunk
    out = []
    for t in tensors:
        if t is not None:
            t = F.pad(t, (0, 0) * (t.dim() - 3) + (0, pad)) if pad else t
            t = t.view(*t.shape[:2], (T + pad) // chunk, chunk, *t.shape[3:])
        out.append(t)
    return out


def chunk_scan(q, k, v, g, beta=None, chunk: int = CHUNK):
    """:func:`recurrent_scan` in chunks of ``chunk`` tokens (module docstring), in fp32 (fp64 for fp64
    inputs); gates per key channel (g of 4 dims) go to :func:`channel_chunk_scan`. -> (o, state)."""
    if g.dim() == 4:
        return channel_chunk_scan(q, k, v, g, beta, chunk)
    dtype = v.dtype
    wide = torch.promote_types(dtype, torch.float32)
    with torch.autocast(q.device.type, enabled=False):
        q, k, v, g = q.to(wide), k.to(wide), v.to(wide), g.to(wide)
        beta = None if beta is None else beta.to(wide)
        B, H, T, K = q.shape
        V = v.shape[-1]
        q, k, v, g, beta = _in_chunks(chunk, q, k, v, g, beta)
        n = q.shape[2]
        gamma = g.cumsum(-1)
        lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
        decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~lower, float("-inf")).exp()
        if beta is None:
            u0, w = v, None
        else:
            a = (beta[..., None] * decay * (k @ k.transpose(-1, -2))).tril(-1)
            system = a + torch.eye(chunk, device=q.device, dtype=wide)
            u0 = torch.linalg.solve_triangular(system, beta[..., None] * v, upper=False, unitriangular=True)
            w = torch.linalg.solve_triangular(system, (beta * gamma.exp())[..., None] * k, upper=False,
                                              unitriangular=True)
        scores = (q @ k.transpose(-1, -2)) * decay
        last = gamma[..., -1:]
        carry = k * (last - gamma).exp()[..., None]  # (B, H, n, C, K)
        S = q.new_zeros(B, H, K, V)
        out = []
        for i in range(n):
            u = u0[:, :, i] if w is None else u0[:, :, i] - w[:, :, i] @ S
            out.append(gamma[:, :, i, :, None].exp() * (q[:, :, i] @ S) + scores[:, :, i] @ u)
            S = last[:, :, i, :, None].exp() * S + carry[:, :, i].transpose(-1, -2) @ u
        o = torch.stack(out, dim=2).view(B, H, n * chunk, V)[:, :, :T]
    return o.to(dtype), S


def channel_chunk_scan(q, k, v, g, beta, chunk: int = CHUNK, sub: int = SUB):
    """:func:`chunk_scan` with a log gate per key channel, g (B, H, T, K) (Kimi Delta Attention's
    fine-grained decay). The module docstring's chunk form holds with gamma_r a vector and each
    exp(gamma_r - gamma_s) a diagonal: (k_r . k_s) becomes sum_c k_rc k_sc exp(gamma_rc - gamma_sc),
    the same for (q_r . k_s); W's right side is beta_r exp(gamma_r) * k_r, a state carries
    k_s * exp(gamma_C - gamma_s) and decays by exp(gamma_C) per channel. -> (o, state).

    Those sums are computed by :func:`_channel_products` in sub-blocks of ``sub`` tokens, as the
    paper's kernels do (secondary chunking): for r in a later sub-block than s, with p the last
    position before r's sub-block, exp(gamma_r - gamma_s) = exp(gamma_r - gamma_p) exp(gamma_p -
    gamma_s), both exponents <= 0, so the sum is a matrix product of (k_r exp(gamma_r - gamma_p))
    and (k_s exp(gamma_p - gamma_s)); within a sub-block the (sub, sub, K) decays are written out.
    Nothing overflows, and the cost is matrix products plus sub x K values a token."""
    dtype = v.dtype
    wide = torch.promote_types(dtype, torch.float32)
    with torch.autocast(q.device.type, enabled=False):
        q, k, v, g, beta = (t.to(wide) for t in (q, k, v, g, beta))
        B, H, T, K = q.shape
        V = v.shape[-1]
        q, k, v, g, beta = _in_chunks(chunk, q, k, v, g, beta)
        n, beta = q.shape[2], beta[..., None]
        gamma = g.cumsum(-2)  # (B, H, n, C, K)
        kk, qk = _channel_products(q, k, gamma, min(sub, chunk))
        system = (beta * kk).tril(-1) + torch.eye(chunk, device=q.device, dtype=wide)
        u0 = torch.linalg.solve_triangular(system, beta * v, upper=False, unitriangular=True)
        w = torch.linalg.solve_triangular(system, beta * gamma.exp() * k, upper=False, unitriangular=True)
        last = gamma[..., -1:, :]  # (B, H, n, 1, K)
        carry, qdecay = k * (last - gamma).exp(), q * gamma.exp()
        S = q.new_zeros(B, H, K, V)
        out = []
        for i in range(n):
            u = u0[:, :, i] - w[:, :, i] @ S
            out.append(qdecay[:, :, i] @ S + qk[:, :, i] @ u)
            S = last[:, :, i].transpose(-1, -2).exp() * S + carry[:, :, i].transpose(-1, -2) @ u
        o = torch.stack(out, dim=2).view(B, H, n * chunk, V)[:, :, :T]
    return o.to(dtype), S


def _channel_products(q, k, gamma, sub: int):
    """(K K^T, Q K^T) of every chunk, each pair (r, s) weighted by exp(gamma_r - gamma_s) per
    channel, s <= r (:func:`channel_chunk_scan`'s secondary chunking); (..., C, C) each."""
    C = q.shape[-2]
    lower = torch.ones(sub, sub, dtype=torch.bool, device=q.device).tril()[..., None]
    rows_k, rows_q = [], []
    for start in range(0, C, sub):
        r = slice(start, min(start + sub, C))
        gr, kr, qr = gamma[..., r, :], k[..., r, :], q[..., r, :]
        m = gr.shape[-2]
        decay = (gr[..., :, None, :] - gr[..., None, :, :]).masked_fill(~lower[:m, :m], float("-inf")).exp()
        inside_k = torch.einsum("...rc,...sc,...rsc->...rs", kr, kr, decay)
        inside_q = torch.einsum("...rc,...sc,...rsc->...rs", qr, kr, decay)
        after = kr.new_zeros(*kr.shape[:-2], m, C - start - m)
        if start:
            p = gamma[..., start - 1:start, :]  # the last position before the sub-block
            right = (k[..., :start, :] * (p - gamma[..., :start, :]).exp()).transpose(-1, -2)
            to = (gr - p).exp()
            rows_k.append(torch.cat([(kr * to) @ right, inside_k, after], dim=-1))
            rows_q.append(torch.cat([(qr * to) @ right, inside_q, after], dim=-1))
        else:
            rows_k.append(torch.cat([inside_k, after], dim=-1))
            rows_q.append(torch.cat([inside_q, after], dim=-1))
    return torch.cat(rows_k, dim=-2), torch.cat(rows_q, dim=-2)


class ShortConv(nn.Module):
    """A depthwise causal convolution over time (kernel 4) and SiLU: the short convolution both
    layers put before their scan (flash-linear-attention's ``ShortConvolution``, Mamba's ``conv1d``)."""

    def __init__(self, channels: int, kernel: int = 4, bias: bool = False):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, kernel, groups=channels, padding=kernel - 1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, T, C)
        return F.silu(self.conv(x.transpose(1, 2))[..., :x.shape[1]].transpose(1, 2))


def dt_bias_init(heads: int, dt_min: float = 1e-3, dt_max: float = 0.1) -> torch.Tensor:
    """Mamba's dt bias: softplus^-1 of dt drawn log-uniformly in [dt_min, dt_max] (floor 1e-4)."""
    dt = torch.exp(torch.rand(heads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=1e-4)
    return dt + torch.log(-torch.expm1(-dt))


class DeltaRule(nn.Module):
    """What Gated DeltaNet and Kimi Delta Attention share: q, k, v projections, each through a short
    convolution and SiLU; q and k L2-normalised per head and q scaled by K^-1/2; beta_t = sigmoid(x W_b);
    the gated delta rule (:func:`scan`); the output RMS-normalised per head, times the layer's
    :meth:`output_gate`, then projected. A layer sets those modules, ``heads``, ``dk``, ``dv``, and
    its :meth:`log_gates`."""

    channel_gates = False  # one decay per head (the preflight counts decays per key channel)

    def scan_shape(self) -> tuple[int, int, int]:
        """(heads, K, V) of the scan's state (the preflight's memory estimate)."""
        return self.heads, self.dk, self.dv

    def heads_first(self, t: torch.Tensor) -> torch.Tensor:
        """(B, T, heads * d) -> (B, heads, T, d)."""
        B, T, _ = t.shape
        return t.view(B, T, self.heads, -1).transpose(1, 2)

    def log_gates(self, x: torch.Tensor, wide: torch.dtype) -> torch.Tensor:
        """The scan's log forget gates for the layer input x: (B, H, T), or (B, H, T, K) per channel."""
        raise NotImplementedError

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        """The gate on the normalised output, (B, T, heads * dv)."""
        raise NotImplementedError

    def scan_inputs(self, x: torch.Tensor):
        """(q, k, v, g, beta) of the scan for the layer input x (B, T, D), heads first."""
        wide = torch.promote_types(x.dtype, torch.float32)
        q = F.normalize(self.heads_first(self.q_conv(self.q_proj(x))).to(wide), dim=-1) / math.sqrt(self.dk)
        k = F.normalize(self.heads_first(self.k_conv(self.k_proj(x))).to(wide), dim=-1)
        v = self.heads_first(self.v_conv(self.v_proj(x)))
        g = self.log_gates(x, wide)
        beta = torch.sigmoid(self.b_proj(x).to(wide)).transpose(1, 2)
        return q, k, v, g, beta

    def forward(self, x: torch.Tensor, enc=None, positions=None, layer: int = 0, cache: dict | None = None):
        B, T, _ = x.shape
        o, _ = scan(*self.scan_inputs(x))  # (B, H, T, dv), in the scan's precision
        o = self.o_norm(o.transpose(1, 2).to(torch.promote_types(o.dtype, torch.float32))).to(x.dtype)  # per head
        return self.proj(o.reshape(B, T, -1) * self.output_gate(x))


class GatedDeltaNet(DeltaRule):
    """Gated DeltaNet (Yang, Kautz & Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta
    Rule", ICLR 2025), as flash-linear-attention's ``GatedDeltaNet`` layer builds it (the form in
    Qwen3-Next): q, k, v projections, each through a short convolution and SiLU; q and k
    L2-normalised per head and q scaled by K^-1/2; beta_t = sigmoid(x W_b); the log gate
    g_t = -exp(A_log) softplus(x W_a + dt_bias), A_log = log U(0, 16) and dt_bias Mamba's; the
    gated delta rule (:func:`chunk_scan`); the output RMS-normalised per head, times SiLU(x W_g),
    then projected. Shape: n_heads / 2 heads of key dim 2 d_model / n_heads (keys d_model wide in
    all) and values twice as wide (the layer's ``expand_v = 2``)."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.heads = max(1, n_heads // 2)
        self.dk = d_model // self.heads
        self.dv = 2 * self.dk
        key, value = self.heads * self.dk, self.heads * self.dv
        self.q_proj, self.k_proj = nn.Linear(d_model, key, bias=False), nn.Linear(d_model, key, bias=False)
        self.v_proj = nn.Linear(d_model, value, bias=False)
        self.q_conv, self.k_conv, self.v_conv = ShortConv(key), ShortConv(key), ShortConv(value)
        self.a_proj = nn.Linear(d_model, self.heads, bias=False)
        self.b_proj = nn.Linear(d_model, self.heads, bias=False)
        self.A_log = nn.Parameter(torch.empty(self.heads).uniform_(0, 16).log())
        self.dt_bias = nn.Parameter(dt_bias_init(self.heads))
        self.g_proj = nn.Linear(d_model, value, bias=False)
        self.o_norm = nn.RMSNorm(self.dv, eps=1e-5)
        self.proj = nn.Linear(value, d_model, bias=False)

    def log_gates(self, x: torch.Tensor, wide: torch.dtype) -> torch.Tensor:
        """g_t = -exp(A_log) softplus(x W_a + dt_bias), one per head: (B, H, T)."""
        return (-self.A_log.to(wide).exp() * F.softplus(self.a_proj(x).to(wide) + self.dt_bias)).transpose(1, 2)

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.g_proj(x))


class KimiDeltaAttention(DeltaRule):
    """Kimi Delta Attention (Kimi Team 2025, "Kimi Linear: An Expressive, Efficient Attention
    Architecture", arXiv:2510.26692), as flash-linear-attention's ``KimiDeltaAttention`` layer builds
    it with its defaults: Gated DeltaNet's delta rule with a forget gate per key channel,
    S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T (:func:`channel_chunk_scan`),
    log alpha_t = -exp(A_log) softplus(f_t + dt_bias) with f_t = x W_f1 W_f2 (a rank-dv bottleneck),
    A_log = log U(1, 16) per head and dt_bias Mamba's per channel; q, k, v through short convolutions
    and SiLU, q and k L2-normalised per head and q scaled by K^-1/2, beta_t = sigmoid(x W_b); the
    output RMS-normalised per head times sigmoid(x W_g1 W_g2 + b) (a low-rank gate, the layer's
    ``FusedRMSNormGated`` with ``activation="sigmoid"``), then projected. Shape: Gated DeltaNet's heads
    here (n_heads / 2 of key dim 2 d_model / n_heads) with values as wide as keys (``expand_v = 1``)."""

    channel_gates = True  # its decays per key channel (the preflight counts them)

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.heads = max(1, n_heads // 2)
        self.dk = self.dv = d_model // self.heads
        key = self.heads * self.dk
        self.q_proj, self.k_proj = nn.Linear(d_model, key, bias=False), nn.Linear(d_model, key, bias=False)
        self.v_proj = nn.Linear(d_model, key, bias=False)
        self.q_conv, self.k_conv, self.v_conv = ShortConv(key), ShortConv(key), ShortConv(key)
        self.f_proj = nn.Sequential(nn.Linear(d_model, self.dv, bias=False), nn.Linear(self.dv, key, bias=False))
        self.b_proj = nn.Linear(d_model, self.heads, bias=False)
        self.A_log = nn.Parameter(torch.empty(self.heads).uniform_(1, 16).log())
        self.dt_bias = nn.Parameter(dt_bias_init(key))
        self.g_proj = nn.Sequential(nn.Linear(d_model, self.dv, bias=False), nn.Linear(self.dv, key, bias=True))
        self.o_norm = nn.RMSNorm(self.dv, eps=1e-5)
        self.proj = nn.Linear(key, d_model, bias=False)

    def log_gates(self, x: torch.Tensor, wide: torch.dtype) -> torch.Tensor:
        """log alpha_t = -exp(A_log) softplus(x W_f1 W_f2 + dt_bias), one per key channel: (B, H, T, K)."""
        f = self.heads_first(self.f_proj(x).to(wide) + self.dt_bias)
        return -self.A_log.to(wide).exp()[:, None, None] * F.softplus(f)

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.g_proj(x))


class Mamba2(nn.Module):
    """Mamba-2 (Dao & Gu, "Transformers are SSMs", ICML 2024), as ``mamba_ssm``'s ``Mamba2`` layer
    builds it with its defaults: expand 2 (d_inner = 2 d_model), head dim 64, d_state 128 (d_model / 2
    in models narrower than 256, whose MLPs could not give up a 128-wide state's projections), one
    group, a short convolution (kernel 4, with bias) and SiLU over (x, B, C); dt = softplus(dt +
    dt_bias); A = -exp(A_log), A_log = log U(1, 16); y = SSD(x, dt, A, B, C) + D x (D = 1 at init)
    (:func:`chunk_scan` with q = C, k = B, v = dt x, g = dt A); then RMSNorm(y SiLU(z)) over d_inner
    and the output projection."""

    channel_gates = False  # one decay per head

    def __init__(self, d_model: int, d_state: int | None = None, headdim: int = 64, expand: int = 2):
        super().__init__()
        self.d_inner, self.d_state = expand * d_model, d_state or min(128, d_model // 2)
        self.headdim = min(headdim, self.d_inner)
        self.heads = self.d_inner // self.headdim
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner + 2 * self.d_state + self.heads, bias=False)
        self.conv = ShortConv(self.d_inner + 2 * self.d_state, bias=True)
        self.A_log = nn.Parameter(torch.empty(self.heads).uniform_(1, 16).log())
        self.dt_bias = nn.Parameter(dt_bias_init(self.heads))
        self.D = nn.Parameter(torch.ones(self.heads))
        self.norm = nn.RMSNorm(self.d_inner, eps=1e-5)
        self.proj = nn.Linear(self.d_inner, d_model, bias=False)

    def scan_shape(self) -> tuple[int, int, int]:
        """(heads, K, V) of the scan's state (the preflight's memory estimate)."""
        return self.heads, self.d_state, self.headdim

    def scan_inputs(self, x: torch.Tensor):
        """(q, k, v, g) of the scan and (x, z) for the skip and the gate, for the layer input x (B, T, D)."""
        B, T, _ = x.shape
        z, xbc, dt = self.in_proj(x).split((self.d_inner, self.d_inner + 2 * self.d_state, self.heads), dim=-1)
        xs, b, c = self.conv(xbc).split((self.d_inner, self.d_state, self.d_state), dim=-1)
        wide = torch.promote_types(x.dtype, torch.float32)
        dt = F.softplus(dt.to(wide) + self.dt_bias).transpose(1, 2)  # (B, H, T)
        xh = xs.view(B, T, self.heads, self.headdim).transpose(1, 2).to(wide)  # (B, H, T, P)
        shared = lambda t: t.to(wide)[:, None].expand(B, self.heads, T, self.d_state)  # noqa: E731
        return (shared(c), shared(b), xh * dt[..., None], -self.A_log.to(wide).exp()[:, None] * dt), xh, z

    def forward(self, x: torch.Tensor, enc=None, positions=None, layer: int = 0, cache: dict | None = None):
        B, T, _ = x.shape
        inputs, xh, z = self.scan_inputs(x)
        y, _ = scan(*inputs)
        y = y.to(xh.dtype) + self.D.to(xh.dtype)[:, None, None] * xh
        y = y.transpose(1, 2).reshape(B, T, self.d_inner)
        return self.proj(self.norm(y * F.silu(z.to(y.dtype))).to(x.dtype))


MIXERS = {"d": lambda cfg: GatedDeltaNet(cfg.d_model, cfg.n_heads),  # model.layers letters besides "a"
          "k": lambda cfg: KimiDeltaAttention(cfg.d_model, cfg.n_heads),
          "m": lambda cfg: Mamba2(cfg.d_model)}
