"""Training-free context extension of rotary models at the attention: Self-Extend, ReRoPE, log-n.

Each changes which positions the rotary angles of a query-key pair use, or the scale of the
query, at inference only; the weights stay as trained. For a query at position i and a key at
j <= i (d = i - j), with q and k the projections before rotation and R(p) the rotation by p:

* **Self-Extend** (Jin et al. 2024, "LLM Maybe LongLM", datamllab/LongLM; neighbour window W,
  group size G): d < W: R(i)q . R(j)k as trained; d >= W: R(i // G + W - W // G)q . R(j // G)k,
  so far keys are seen at grouped distances that stay within what the model trained on.
* **ReRoPE** (Su 2023, bojone/rerope; window W): d < W as trained; d >= W: R(W)q . k, the
  relative position clipped at W.
* **log-n** (Chiang & Cholak 2022; Qwen's ``use_logn_attn``): q times max(1, log_{L} (i + 1)),
  L the trained context, so attention stays as sharp over more keys; the factor is
  :func:`posbench.model.length_scaling.logn_factor`, the one posbench's own models train with
  (``model.length_scaling=logn``).

:func:`extended_attention` computes any of them exactly, query chunk by query chunk (two score
blocks of (chunk, keys) at a time, so memory grows with the length, not its square), and
:func:`direct_logits` is the definition above written out pair by pair, which the tests hold it
to. Hugging Face models use it through transformers' attention interface
(:func:`hf_attention`): the q and k it receives are already rotated by positions 0..T-1, so it
rotates them back first. posbench's own models use it inside :meth:`PositionEncoding.extended
<posbench.encodings.base.PositionEncoding.extended>`: the attention layer hands Self-Extend and
ReRoPE its q and k before rotation, with the encoding's frequencies, and scales the rotated
queries for log-n (any encoding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import PosbenchError
from ..model.length_scaling import logn_factor

METHODS = ("none", "self_extend", "rerope", "logn")


@dataclass(frozen=True)
class Extension:
    """A method and its parameters (``eval.extension``, ``eval.extension_window``,
    ``eval.extension_group``); ``train_len``: the model's trained context."""

    method: str = "none"
    window: int | None = None
    group: int | None = None
    train_len: int = 0

    def __post_init__(self):
        if self.method not in METHODS:
            raise PosbenchError(f"eval.extension={self.method!r} is not valid; valid choices: {', '.join(METHODS)}")
        if self.method in ("self_extend", "rerope") and not (self.window and self.window > 0):
            raise PosbenchError(f"eval.extension={self.method} needs eval.extension_window > 0 (the neighbour "
                                f"window W), got {self.window}; e.g. eval.extension_window=512")
        if self.method == "self_extend" and not (self.group and self.group > 1):
            raise PosbenchError(f"eval.extension=self_extend needs eval.extension_group > 1 (the group size G), got "
                                f"{self.group}; e.g. eval.extension_group=8")

    @property
    def label(self) -> str:
        """How results rows name it: ``self_extend(W=512,G=8)``, ``rerope(W=512)``, ``logn``."""
        if self.method == "self_extend":
            return f"self_extend(W={self.window},G={self.group})"
        if self.method == "rerope":
            return f"rerope(W={self.window})"
        return self.method

    def identity_at(self, length: int) -> bool:
        """Whether the method leaves the model as trained on windows of ``length`` tokens: every
        distance is inside the window W (Self-Extend, ReRoPE), or every query inside the trained
        context (log-n)."""
        if self.method in ("self_extend", "rerope"):
            return length <= self.window
        return self.method == "none" or length <= self.train_len

    def positions(self, i: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(query position, key position) of the far pairs (d >= W) for queries ``i`` (Tq, 1)
        and keys ``j`` (1, Tk)."""
        if self.method == "self_extend":
            return i // self.group + self.window - self.window // self.group, j // self.group
        return torch.full_like(i, self.window), torch.zeros_like(j)  # rerope

    def check_scaling(self, kind: str) -> None:
        """One line unless the method runs beside RoPE scaling ``kind``: log-n scales the queries
        and takes any scaling (``yarn+logn``); Self-Extend and ReRoPE set the positions of the
        rotation themselves, on the trained frequencies, so they take none."""
        if self.method in ("self_extend", "rerope") and kind != "none":
            raise PosbenchError(f"eval.extension={self.method} sets the rotary positions itself, on the trained "
                                f"frequencies, so it takes no eval.rope_scaling (got {kind}); valid with it: "
                                "eval.rope_scaling=none (eval.extension=logn takes any scaling)")

    def query_scale(self, i: torch.Tensor) -> torch.Tensor:
        """log-n's factor per query position (ones for the other methods)."""
        if self.method != "logn":
            return torch.ones_like(i, dtype=torch.float32)
        return logn_factor(i + 1, self.train_len)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate the last dim of ``x`` by ``angles`` (..., hs/2), half-split pairs (x_k, x_{k+hs/2}),
    the convention of Llama and of posbench's ``pairing=half``."""
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    return x * cos + rotate_half(x) * sin


def extended_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inv_freq: torch.Tensor, ext: Extension,
                       scaling: float, chunk: int = 256, fused: bool = True) -> torch.Tensor:
    """Causal attention of unrotated ``q`` (B, H, T, hs), ``k``, ``v`` (B, H_kv, T, hs) under ``ext``
    -> (B, H, T, hs) in fp32; H_kv divides H (grouped-query attention: each KV head serves H / H_kv
    query heads, broadcast rather than copied). ``inv_freq`` (hs/2,): the rotary frequencies;
    ``scaling``: the logit scale.

    ``none`` and ``log-n`` change no angle, so they are one fused causal attention of the scaled,
    rotated queries. Self-Extend and ReRoPE split each query's keys in two: the near keys
    (i - j < W) with the trained rotation and the far ones (i - j >= W) with the method's. On CPU
    (``fused``) each part is a fused attention that also returns its log-sum-exp (the CPU flash
    kernel), merged as one softmax would (:func:`_two_fused`); elsewhere, query chunk by query
    chunk, each chunk scoring only the keys it can see, so a chunk costs (chunk, keys up to its
    end + chunk) rather than two blocks over every key."""
    B, H, T, hs = q.shape
    groups = H // k.shape[1]
    pos = torch.arange(T, device=q.device)
    freq = inv_freq.float().to(q.device)
    qs, v = q.float() * ext.query_scale(pos)[:, None], v.float()
    if fused and ext.method in ("self_extend", "rerope") and q.device.type == "cpu" and _FLASH is not None:
        return _two_fused(qs, k.float(), v, pos, freq, ext, scaling, groups)  # rotates q and k itself
    k_near = rotate(k.float(), pos[:, None] * freq)
    if ext.method in ("none", "logn"):
        return F.scaled_dot_product_attention(rotate(qs, pos[:, None] * freq), k_near, v, is_causal=True,
                                              scale=scaling, enable_gqa=groups > 1)
    qs = qs.view(B, k.shape[1], groups, T, hs)  # (B, H_kv, G, T, hs): query heads by their KV head
    k_near, v = k_near[:, :, None], v[:, :, None]  # (B, H_kv, 1, T, hs)
    k_far = rotate(k.float(), ext.positions(pos[:, None], pos[None, :])[1][0][:, None] * freq)[:, :, None]
    out = torch.empty_like(qs)
    W = ext.window
    for start in range(0, T, chunk):
        end = min(start + chunk, T)
        i, qc = pos[start:end, None], qs[..., start:end, :]  # (C, 1), (B, H_kv, G, C, hs)
        scores = qc.new_full((*qc.shape[:-1], end), float("-inf"))  # keys 0 .. end-1
        far_end, near_start = max(0, end - W), max(0, start - W + 1)  # far: keys j < end - W; near: j > start - W
        if far_end:
            j = pos[None, :far_end]
            far = rotate(qc, ext.positions(i, j)[0] * freq) @ k_far[..., :far_end, :].transpose(-1, -2)
            scores[..., :far_end] = far.masked_fill(i - j < W, float("-inf"))
        j = pos[None, near_start:end]
        near = rotate(qc, i * freq) @ k_near[..., near_start:end, :].transpose(-1, -2)
        scores[..., near_start:end] = torch.where((i >= j) & (i - j < W), near, scores[..., near_start:end])
        out[..., start:end, :] = (scores * scaling).softmax(-1) @ v[..., :end, :]
    return out.view(B, H, T, hs)


_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _two_fused(q, k, v, pos, freq, ext: Extension, scaling: float, groups: int) -> torch.Tensor:
    """Self-Extend or ReRoPE from two fused attentions and their log-sum-exps: the far part is a
    causal attention of the queries at W.. against the keys at ..T-W-1 (query i sees j <= i - W),
    with the method's positions; the near part, the band i - W < j <= i with the trained ones, one
    block of W queries at a time against its 2W - 1 keys. Each query's two parts are merged with
    weights exp(lse): exactly the softmax over all its keys. q (B, H, T, hs) scaled, k, v (B, H_kv,
    T, hs) -> (B, H, T, hs) fp32."""
    B, H, T, hs = q.shape
    W = ext.window
    if groups > 1:  # the CPU flash kernel takes one head count
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    angles = pos[:, None] * freq
    q_near, k_near = rotate(q, angles), rotate(k, angles)
    out, lse = torch.empty_like(q), q.new_empty(B, H, T)
    offsets = torch.arange(W, device=q.device)
    for start in range(0, T, W):
        end, first = min(start + W, T), max(0, start - W + 1)
        d = (start + offsets[: end - start])[:, None] - torch.arange(first, end, device=q.device)[None, :]
        mask = torch.zeros(d.shape, device=q.device).masked_fill((d < 0) | (d >= W), float("-inf"))
        out[..., start:end, :], lse[..., start:end] = _FLASH(q_near[..., start:end, :], k_near[..., first:end, :],
                                                             v[..., first:end, :], attn_mask=mask, scale=scaling)
    if T <= W:
        return out
    far_q, far_k = ext.positions(pos[W:, None], pos[None, : T - W])
    o_far, lse_far = _FLASH(rotate(q[..., W:, :], far_q * freq), rotate(k[..., : T - W, :], far_k[0][:, None] * freq),
                            v[..., : T - W, :], is_causal=True, scale=scaling)
    near_w = torch.sigmoid(lse[..., W:] - lse_far)[..., None]  # exp(lse) / (exp(lse) + exp(lse_far))
    out[..., W:, :] = near_w * out[..., W:, :] + (1 - near_w) * o_far
    return out


def direct_logits(q: torch.Tensor, k: torch.Tensor, inv_freq: torch.Tensor, ext: Extension) -> torch.Tensor:
    """The module docstring's definition, one (i, j) pair at a time, for tests: (H, T, hs) q, k
    unrotated -> (H, T, T) logits before the causal mask and the logit scale."""
    H, T, _ = q.shape
    out = torch.zeros(H, T, T)
    for i in range(T):
        scale = max(1.0, math.log(i + 1) / math.log(ext.train_len)) if ext.method == "logn" else 1.0
        for j in range(i + 1):
            qi, kj = i, j
            if ext.method == "self_extend" and i - j >= ext.window:
                qi, kj = i // ext.group + ext.window - ext.window // ext.group, j // ext.group
            elif ext.method == "rerope" and i - j >= ext.window:
                qi, kj = ext.window, 0
            a = rotate(q[:, i].float() * scale, qi * inv_freq.float())
            b = rotate(k[:, j].float(), kj * inv_freq.float())
            out[:, i, j] = (a * b).sum(-1)
    return out


_ACTIVE: dict = {}  # what hf_attention applies: {"ext": Extension, "inv_freq": tensor}, set by PositionScheme.extended
HF_NAME = "posbench_extension"


def hf_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs):
    """transformers' attention-function signature (``ALL_ATTENTION_FUNCTIONS``): ``query`` (B, H,
    T, hs) and ``key``/``value`` (B, H_kv, T, hs), the first two rotated by positions 0..T-1 ->
    (output (B, T, H, hs), None). log-n only scales the rotated queries, so it runs the model's own
    SDPA attention on them; Self-Extend and ReRoPE rotate q and k back and attend under the active
    :class:`Extension` (grouped-query heads broadcast, not copied)."""
    ext, inv_freq = _ACTIVE["ext"], _ACTIVE["inv_freq"]
    T = query.shape[-2]
    if ext.method == "logn":
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        scale = ext.query_scale(torch.arange(T, device=query.device))[:, None].to(query.dtype)
        return sdpa_attention_forward(module, query * scale, key, value, None, dropout=dropout, scaling=scaling)
    back = -torch.arange(T, device=query.device)[:, None] * inv_freq.float().to(query.device)
    q, k = rotate(query.float(), back), rotate(key.float(), back)
    out = extended_attention(q, k, value, inv_freq, ext, scaling)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None
