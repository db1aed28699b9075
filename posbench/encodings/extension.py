"""Training-free context extension of rotary models at the attention: Self-Extend, ReRoPE, log-n,
Llama 3's RoPE scaling, STRING, attention sinks (StreamingLLM), LM-Infinite, Dual Chunk Attention.

Each changes which positions the rotary angles of a query-key pair use, which keys a query sees,
the rotary frequencies, or the scale of q and k, at inference only; the weights stay as trained.
For a query at position i and a key at j <= i (d = i - j), with q and k the projections before
rotation, R(p) the rotation by p, L the trained context (``train_len``) and T the window.

Each method is a class of :mod:`posbench.methods` (its paper, reference code, parameters and
defaults in its docstring): Self-Extend and ReRoPE (``regroup``: near keys as trained, far keys at
positions of their own), log-n and llama3 (one fused attention: no position moves), STRING,
attention sinks, LM-Infinite and Dual Chunk Attention (computed from their ``parts``). This module
computes the attention of any of them from its hooks, and writes their definitions out pair by pair
(:func:`pair_positions`, independently of the classes) for the tests.

Which keys a query sees is a hook of its own (:meth:`Extension.visible`), and the positions
come as parts (:meth:`Extension.parts`): each a set of (query, key) pairs with a query position
per query and a key position per key, so any method is a few rotations and a mask.
:func:`extended_attention` computes any of them exactly, query block by query block, so memory
grows with the length, not its square: on the CPU each part of a block is one fused attention that
also returns its log-sum-exp (the CPU flash kernel, :func:`_fused_parts`), the parts merged as one
softmax over their keys would; elsewhere one score block of (chunk, keys) at a time
(:func:`parts_attention`). One layer at SmolLM2-135M's shapes and 16k tokens took 2.8-3.3x less
time fused than in score blocks for STRING, sinks, LM-Infinite and DCA, 1.1-1.3x Self-Extend's
own two fused calls (results/bench/extension_speed.md, ``scripts/extension_speed.py``). And
:func:`direct_logits` is the definitions written out pair by pair, which the tests hold it to.
Hugging Face models use it through transformers' attention interface (:func:`hf_attention`):
the q and k it receives are already rotated by positions 0..T-1, so it rotates them back first.
posbench's own models use it inside :meth:`PositionEncoding.extended
<posbench.encodings.base.PositionEncoding.extended>`: the attention layer hands a method that
sets positions (:attr:`Extension.sets_positions`) its q and k before rotation, with the
encoding's frequencies, and scales the rotated queries for log-n (any encoding); a method that
sets positions but reaches the ordinary kernel instead stops there with one line
(:func:`posbench.model.attention.causal_attention`), never giving the numbers as trained.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..methods import Extension, Part, llama3_inv_freq, logn_factor, methods  # noqa: F401 - re-exported
from .rotation import rotate

METHODS = tuple(methods())  # eval.extension's valid names: the registry's (posbench.methods)
ONE_ATTENTION_METHODS = tuple(n for n, c in methods().items() if c.kernel == "one")  # one fused causal attention
PARTS_METHODS = tuple(n for n, c in methods().items() if c.kernel == "parts")  # computed from their parts
# queries per fused call of the parts path: its mask is (block, keys) fp32. At SmolLM2's shapes, 8k
# tokens, one STRING layer took 7.9, 5.1, 3.4 and 4.1 s at 512, 1,024, 2,048 and 4,096 (one run,
# beside a busy process): each call's fixed work is paid T / block times
FUSED_BLOCK = 2048


def extended_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inv_freq: torch.Tensor, ext: Extension,
                       scaling: float, chunk: int = 256, fused: bool = True, block: int | None = None) -> torch.Tensor:
    """Causal attention of unrotated ``q`` (B, H, T, hs), ``k``, ``v`` (B, H_kv, T, hs) under ``ext``
    -> (B, H, T, hs) in fp32; H_kv divides H (grouped-query attention: each KV head serves H / H_kv
    query heads, broadcast rather than copied). ``inv_freq`` (hs/2,): the rotary frequencies;
    ``scaling``: the logit scale.

    ``none``, ``log-n`` and ``llama3`` change no position, so they are one fused causal attention
    of the scaled, rotated queries (llama3 on its frequencies). Self-Extend and ReRoPE split each
    query's keys in two: the near keys (i - j < W) with the trained rotation and the far ones
    (i - j >= W) with the method's. On CPU (``fused``) each part is a fused attention that also
    returns its log-sum-exp (the CPU flash kernel), merged as one softmax would
    (:func:`_two_fused`); elsewhere, query chunk by query chunk, each chunk scoring only the keys
    it can see, so a chunk costs (chunk, keys up to its end + chunk) rather than two blocks over
    every key. The other methods run over their parts: on CPU (``fused``) ``block`` queries at a
    time (default :data:`FUSED_BLOCK`), each part one fused attention (:func:`_fused_parts`);
    elsewhere the same query chunks as above (:func:`parts_attention`)."""
    B, H, T, hs = q.shape
    groups = H // k.shape[1]
    pos = torch.arange(T, device=q.device)
    freq = ext.frequencies(inv_freq.float(), T).to(q.device)
    qs, v = q.float() * ext.query_scale(pos)[:, None], v.float()
    flash = fused and q.device.type == "cpu" and _FLASH is not None
    if ext.kernel == "parts":
        if flash:
            return _fused_parts(qs, k.float(), v, freq, ext, scaling, block or FUSED_BLOCK)
        return parts_attention(qs, k.float(), v, freq, ext, scaling, chunk)
    if flash and ext.kernel == "regroup":
        return _two_fused(qs, k.float(), v, pos, freq, ext, scaling, groups)  # rotates q and k itself
    k_near = rotate(k.float(), pos[:, None] * freq)
    if ext.kernel == "one":
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


def parts_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, freq: torch.Tensor, ext: Extension,
                    scaling: float, chunk: int = 256) -> torch.Tensor:
    """Attention under any method from its parts (:meth:`Extension.parts`) and its mask
    (:meth:`Extension.visible`): query chunk by query chunk, each part's pairs scored with its own
    rotations of q and k over the key range it needs, the others left at -inf, one softmax over
    them all. q (B, H, T, hs) scaled, k, v (B, H_kv, T, hs) fp32 -> (B, H, T, hs) fp32."""
    B, H, T, hs = q.shape
    H_kv = k.shape[1]
    m = ext.attention_factor(T)  # on q and on k
    pos = torch.arange(T, device=q.device)
    parts = ext.parts(T, q.device)
    keys = [rotate(k * m, part.k_pos[:, None] * freq)[:, :, None] for part in parts]  # (B, H_kv, 1, T, hs) each
    qs, v = q.view(B, H_kv, H // H_kv, T, hs) * m, v[:, :, None]
    out = torch.empty_like(qs)
    for start in range(0, T, chunk):
        end = min(start + chunk, T)
        i, qc = pos[start:end, None], qs[..., start:end, :]  # (C, 1), (B, H_kv, G, C, hs)
        scores = qc.new_full((*qc.shape[:-1], end), float("-inf"))  # keys 0 .. end-1
        for part, k_part in zip(parts, keys):
            lo, hi = part.keys(start, end)
            if hi <= lo:
                continue
            j = pos[None, lo:hi]
            part_scores = rotate(qc, part.q_pos[start:end, None] * freq) @ k_part[..., lo:hi, :].transpose(-1, -2)
            scores[..., lo:hi] = torch.where(part.holds(i, j) & ext.visible(i, j), part_scores, scores[..., lo:hi])
        out[..., start:end, :] = (scores * scaling).softmax(-1) @ v[..., :end, :]
    return out.view(B, H, T, hs)


_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _fused_parts(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, freq: torch.Tensor, ext: Extension,
                 scaling: float, block: int) -> torch.Tensor:
    """:func:`parts_attention` without its score blocks: ``block`` queries at a time, each part's
    pairs (within :meth:`Extension.visible`) over the part's key range are one call of the CPU flash
    kernel with that mask as a float mask, which also returns each query's log-sum-exp; the parts
    are merged with weights exp(lse_part - logsumexp of every part's lse), exactly the softmax over
    all the query's keys. A query with no key in a part (a mask row all -inf, for which the kernel
    returns 0 for both) gets lse -inf there, so weight 0. q (B, H, T, hs) scaled, k, v (B, H_kv,
    T, hs) fp32 -> (B, H, T, hs) fp32."""
    B, H, T, hs = q.shape
    if H > k.shape[1]:  # the CPU flash kernel takes one head count
        k, v = k.repeat_interleave(H // k.shape[1], dim=1), v.repeat_interleave(H // k.shape[1], dim=1)
    m = ext.attention_factor(T)  # on q and on k
    pos = torch.arange(T, device=q.device)
    parts = ext.parts(T, q.device)
    keys = [rotate(k * m, part.k_pos[:, None] * freq) for part in parts]
    q, out = q * m, torch.empty_like(q)
    for start in range(0, T, block):
        end = min(start + block, T)
        i, outs, lses = pos[start:end, None], [], []
        for part, k_part in zip(parts, keys):
            lo, hi = part.keys(start, end)
            if hi <= lo:
                continue
            j = pos[None, lo:hi]
            seen = part.holds(i, j) & ext.visible(i, j)
            mask = torch.zeros(seen.shape, device=q.device).masked_fill_(~seen, float("-inf"))
            o, lse = _FLASH(rotate(q[..., start:end, :], part.q_pos[start:end, None] * freq), k_part[..., lo:hi, :],
                            v[..., lo:hi, :], attn_mask=mask, scale=scaling)[:2]
            outs.append(o)
            lses.append(lse.masked_fill(~seen.any(-1), float("-inf")))
        lse = torch.stack(lses)  # (parts, B, H, block); every query sees itself, so the total is finite
        weights = torch.exp(lse - torch.logsumexp(lse, 0))
        out[..., start:end, :] = (weights[..., None] * torch.stack(outs)).sum(0)
    return out


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


def pair_positions(ext: Extension, i: int, j: int, T: int) -> tuple[int, int] | None:
    """The rotary positions (query, key) of the pair (i, j <= i) in a window of T by the module
    docstring's definitions, or None where the query does not see the key; sinks and DCA as their
    references compute them (a cache kept as streaming-llm keeps it; ChunkLlama's position
    tables)."""
    d, W, G = i - j, ext.window, ext.group
    if ext.method == "self_extend":
        return (i, j) if d < W else (i // G + W - W // G, j // G)
    if ext.method == "rerope":
        return (i, j) if d < W else (W, 0)
    if ext.method == "string":  # S = window, local value W = group
        return (i, j) if d < W else (i - W + G, j)
    if ext.method == "sinks":  # StartRecentKVCache(start_size=G, recent_size=W - 1), then the query appended
        cache = list(range(i + 1)) if i < G + W else list(range(G)) + list(range(i - W + 1, i + 1))
        return (len(cache) - 1, cache.index(j)) if j in cache else None
    if ext.method == "lm_infinite":  # local branch W, global branch G, limit_distance = train_len
        if d < W:
            return i, j
        return (min(ext.train_len, T - 1), 0) if j < G else None
    if ext.method == "dca":  # chunk_size W, local_window G
        c = W - G
        q_t, qc_t = list(range(c)), [min(p + c, W) for p in range(c)]
        if i // c == j // c:
            return q_t[i % c], j % c
        return (qc_t[i % c] if i // c == j // c + 1 else qc_t[c - 1]), j % c
    return i, j


def direct_logits(q: torch.Tensor, k: torch.Tensor, inv_freq: torch.Tensor, ext: Extension) -> torch.Tensor:
    """The module docstring's definitions, one (i, j) pair at a time, for tests: (H, T, hs) q, k
    unrotated -> (H, T, T) logits before the causal mask and the logit scale; -inf where a query
    does not see an earlier key (sinks, LM-Infinite)."""
    H, T, _ = q.shape
    out = torch.zeros(H, T, T)
    freq = ext.frequencies(inv_freq.float(), T)
    m = ext.attention_factor(T)
    for i in range(T):
        scale = max(1.0, math.log(i + 1) / math.log(ext.train_len)) if ext.method == "logn" else 1.0
        for j in range(i + 1):
            pair = pair_positions(ext, i, j, T)
            if pair is None:
                out[:, i, j] = float("-inf")
                continue
            a = rotate(q[:, i].float() * scale * m, pair[0] * freq)
            b = rotate(k[:, j].float() * m, pair[1] * freq)
            out[:, i, j] = (a * b).sum(-1)
    return out


_ACTIVE: dict = {}  # what hf_attention applies: {"ext": Extension, "inv_freq": tensor}, set by PositionScheme.extended
HF_NAME = "posbench_extension"


def hf_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs):
    """transformers' attention-function signature (``ALL_ATTENTION_FUNCTIONS``): ``query`` (B, H,
    T, hs) and ``key``/``value`` (B, H_kv, T, hs), the first two rotated by positions 0..T-1 ->
    (output (B, T, H, hs), None). log-n only scales the rotated queries, so it runs the model's own
    SDPA attention on them; the other methods rotate q and k back and attend under the active
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
