"""Causal attention kernels, picked by the hooks an encoding overrides and by measurement.

=======================  ====================================================================
encoding                 kernel
=======================  ====================================================================
no ``bias``/``score``    fused ``scaled_dot_product_attention`` (``is_causal``; flash on GPU);
                         while training at T <= ``EXPLICIT_MAX_LEN``: explicit matmul-softmax
``bias``,                *flex attention* (:func:`flex_causal`): the bias of each distance
``relative_bias``,       i - j, an (H, T) table, added inside the kernel by a ``score_mod``; a
on CUDA, no ``decay``,   causal (and windowed) block mask skips the blocks above the diagonal;
consecutive positions    no (H, T, T) matrix, forward or backward (``POSBENCH_FLEX`` below)
``bias``, one chunk      the masked bias (H, T, T), built once per forward pass when it is the
(T <= chunk)             same in every layer; SDPA with it as a float mask (explicit while
                         training short)
``bias``, longer,        *Toeplitz slices*: one masked bias (H, chunk, T) per forward pass,
``relative_bias``,       shared by every query chunk of every layer (below)
consecutive positions
``bias``, other          the bias of each query chunk against its keys, per layer
``score`` / ``value``    explicit softmax attention in query chunks (memory linear in T)
``normalize``            explicit attention in query chunks, the encoding's weights in place
                         of softmax (stick-breaking), their remainder on the query's own value
``decay``                SDPA in query chunks, each with its (B, H, chunk, keys) mask of
                         c_i - c_j (c the cumulative log forget gates) plus any bias
``transition``           the Householder chunks of :mod:`posbench.model.householder` (PaTH):
                         each token's transform between query and key, plus any decay
=======================  ====================================================================

A sliding window (``window``: ``model.window``, or an encoding's ``attention_window(layer)``)
hides the keys at i - j >= window in every path's mask; with no bias, where SDPA's
``is_causal`` has no window, attention runs in query chunks with a (chunk, keys) mask.

Why these choices (the measurements behind them are in results/bench/, made by
``posbench bench --kernels``; figures in a docstring go stale, so none are quoted here):

* On CPU the fused SDPA forward is faster than an explicit matmul-softmax, but its backward
  is slower at short lengths, so training at train_len <= ``EXPLICIT_MAX_LEN`` runs explicit
  attention; evaluation and longer training use SDPA.
* A bias that depends on i - j only (ALiBi, T5, KERPLE, Sandwich, dynamic; the encoding
  says so with ``relative_bias``) is a Toeplitz matrix, so the bias of query chunk
  [s, e) against keys [0, e) is a slice of one (H, chunk, T) matrix M built for query
  positions T - chunk .. T - 1: rows r0.., columns T - chunk + r0 - s .. (see
  :func:`_toeplitz_slice`). Building the bias once instead of per chunk and layer is
  faster at long lengths. M is built in row blocks, so no fp32 (H, chunk, T) intermediate
  exists; its bf16 size at 16,384 tokens is 256 MiB.
* Flex attention (``score_mod``, compiled by inductor) computes such a bias inside the
  kernel with no matrix at all. On CPU it was slower than the Toeplitz slices, after a long
  compile (results/bench/bench.md), and it has no backward there, so the CPU keeps the paths
  above. Inside a compiled model the CPU cannot run even its forward (torch 2.13): inductor's
  CPU flex template cannot read a bias table computed in the same graph (a captured
  ``Pointwise`` it cannot name: NotImplementedError, then NoValidChoicesError), while the same
  table passed in as a graph input compiles. The GPU's Triton template took such a table in
  tests/test_gpu.py's small compiled model, so the failure below needs its own traceback.
  On CUDA it is the path of every ``relative_bias`` encoding when asked for (``POSBENCH_FLEX=1``;
  :func:`flex_causal`): the bias is read from an (H, T) table of
  distances 0 .. T - 1, which the encoding's own ``bias`` builds, so gradients reach its
  parameters (T5's buckets, KERPLE's r1 and r2) through flex attention's gradient of captured
  tensors. It is not the default: on one H100 (torch 2.11) its kernel tests passed, but the
  compiled training step of ``model=base`` at T=512 failed in dynamo for alibi, t5 and
  kerple_log, which the paths above trained (results/bench/gpu/README.md). ``POSBENCH_FLEX=1``
  takes it on any device (on CPU: flex's eager reference, for tests comparing it with the
  paths above); unset or ``0``, on none. Speed on a GPU:
  results/bench/gpu/ (``posbench bench --device cuda``).

Memory: the fp32 tensors of the chunked kernels hold at most ``ATTN_BUDGET`` elements
(128 MiB) per value an encoding keeps per (query, key) pair (``pair_cost``: one per head,
more for FIRE's MLP and CoPE's counts); the query chunk shrinks at long lengths to keep
them there.

Positions are strictly increasing, shared by the batch: ``arange(T)`` by default, any sorted
set of distinct positions when the model is given them (randomized positions,
:mod:`posbench.encodings.randomized`). Either way the token at index i sees the tokens at indexes <= i,
so a query chunk [s, e) only sees keys [0, e), and the causal mask compares positions
(:func:`_future`). The Toeplitz slices need more: a difference of indexes must be a difference
of positions, which holds for consecutive positions only. The model says which it passes
(``cache["contiguous"]``); a caller that does not say gets it checked from the positions.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ..encodings import PositionEncoding
from ..errors import PosbenchError
from ..runs.kernels import sdpa_bias_backends
from .householder import householder_attention


def flex_setting(value: str | None) -> bool | None:
    """``POSBENCH_FLEX``: "1" -> True (flex attention for relative biases on every device), "0"
    -> False (on none), unset or anything else -> None (the default: on none, module docstring)."""
    return {"1": True, "0": False}.get(value or "")


FLEX = flex_setting(os.environ.get("POSBENCH_FLEX"))  # read once, at import; tests set it directly
SDPA_BIAS = sdpa_bias_backends()  # POSBENCH_SDPA_BIAS, read once, at import; tests set it directly
FLEX_RECOMPILES = 64  # shapes (batch, length, grad or not) the compiled flex kernel may specialise for
EXPLICIT_MAX_LEN = 128  # training at T <= this: explicit attention (faster backward on CPU)
EXPLICIT_HOOKS = frozenset({"score", "value", "normalize"})  # hooks that take the explicit query chunks
SINK_REFUSES = frozenset({"normalize", "transition"})  # hooks with no softmax to add a sink to
ATTN_BUDGET = 1 << 25  # elements of one fp32 score / bias tensor in the chunked kernels


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enc: PositionEncoding,
                     positions: torch.Tensor, layer: int, chunk_size: int = 1024,
                     cache: dict | None = None, decay: torch.Tensor | None = None, window: int = 0,
                     transition: tuple[torch.Tensor, torch.Tensor] | None = None,
                     sink: torch.Tensor | None = None) -> torch.Tensor:
    """q, k, v: (B, H, T, hs) -> (B, H, T, hs). ``cache``: a dict living for one forward pass.
    ``decay``: (B, H, T) cumulative log forget gates c (the ``decay`` hook's gates summed over
    T): the logit of (i, j) gains c_i - c_j, after the logit scale. ``window``: sliding-window
    attention, the query at position i seeing the keys at i - window < j <= i (0: every j <= i).
    ``transition``: the ``transition`` hook's (w, beta) for this layer's tokens (:func:`token_transforms`).
    ``sink``: (H,) learned sink logits (``model.sinks``), one more term exp(sink) in each softmax's
    denominator with no value: explicit attention in query chunks (:func:`_explicit_chunks`).
    An extension that sets the positions or the visible keys itself (``Extension.sets_positions``)
    is computed by ``enc.extended_attention`` from q and k before rotation, never here: one line
    rather than numbers silently as trained."""
    ext = getattr(enc, "extension", None)
    if ext is not None and ext.sets_positions:
        raise PosbenchError(f"eval.extension={ext.method} must run through the encoding's extended_attention "
                            "(q and k before rotation); this attention layer did not hand it there")
    hooks, scale = enc.hooks(), enc.logit_scale()
    B, _, T, _ = q.shape
    if sink is not None:
        refuse_sinks(enc)
    if transition is not None:
        if ({"bias"} | EXPLICIT_HOOKS) & set(hooks):
            raise PosbenchError(f"encoding {enc.name!r}: the transition hook takes no bias, score, value or "
                                "normalize hook beside it (householder_attention adds decay alone)")
        return householder_attention(q, k, v, *transition, scale, positions, decay, window)
    if EXPLICIT_HOOKS & set(hooks) or sink is not None:
        return _explicit_chunks(q, k, v, enc, positions, layer, _rows(chunk_size, B * enc.pair_cost() * T), decay,
                                window, sink)
    explicit = torch.is_grad_enabled() and T <= EXPLICIT_MAX_LEN and q.device.type == "cpu"
    cache = {} if cache is None else cache
    if decay is None and "bias" in hooks and enc.relative_bias and flex_wanted(q) and _contiguous(cache, positions):
        return flex_causal(q, k, v, enc, positions, layer, cache, window)
    if decay is not None:
        return _decay_chunks(q, k, v, enc, positions, layer, chunk_size, decay, explicit, window)
    if "bias" not in hooks:
        if explicit:
            mask = _shared(cache, f"causal{window}", lambda: _causal_mask(positions, q.dtype, window))
            return _explicit(q, k, v, mask, scale)
        if window:  # SDPA's is_causal has no window: a (chunk, keys) mask per query chunk
            return sdpa_chunks(q, k, v, chunk_size, scale,
                               lambda s, e: _causal_mask(positions, q.dtype, window, s, e))
        return fused_causal(q, k, v, scale)
    if T <= chunk_size:
        if enc.layer_invariant_bias:
            mask = _shared(cache, f"bias{window}",
                           lambda: masked_bias(enc, positions, positions, layer, q.dtype, window))
        else:
            mask = masked_bias(enc, positions, positions, layer, q.dtype, window)
        if explicit:
            return _explicit(q, k, v, mask, scale)
        return biased_sdpa(q, k, v, mask, scale)
    if enc.relative_bias and enc.layer_invariant_bias and _contiguous(cache, positions):
        table = _shared(cache, f"toeplitz{window}",
                        lambda: _toeplitz(enc, positions, layer, chunk_size, q.dtype, window))
        return sdpa_chunks(q, k, v, chunk_size, scale, lambda s, e: _toeplitz_slice(table, T, s, e))
    rows = _rows(chunk_size, enc.pair_cost() * T)
    return sdpa_chunks(q, k, v, rows, scale,
                       lambda s, e: masked_bias(enc, positions[s:e], positions[:e], layer, q.dtype, window))


def refuse_sinks(enc: PositionEncoding) -> None:
    """One line where ``enc`` has a hook with no softmax to add a learned sink to (``model.sinks``)."""
    refused = sorted(SINK_REFUSES & set(enc.hooks()))
    if refused:
        raise PosbenchError(f"model.sinks=true takes no {refused[0]!r} hook (encoding {enc.name!r}): a sink is a "
                            f"term of softmax's denominator; valid: an encoding without the "
                            f"{', '.join(sorted(SINK_REFUSES))} hooks")


def flex_wanted(q: torch.Tensor) -> bool:
    """Whether a relative bias runs through :func:`flex_causal` for ``q``: only where
    ``POSBENCH_FLEX=1`` asks for it (the module docstring says why it is not the default)."""
    return bool(FLEX) and q.device.type in ("cuda", "cpu")


def distance_table(enc: PositionEncoding, positions: torch.Tensor, layer: int) -> torch.Tensor:
    """(H, T) fp32: column d the bias of distance i - j = d, for d = 0 .. T - 1, from the
    encoding's ``bias`` of the last query against every key (key j is at distance T - 1 - j),
    so autograd reaches its parameters. Needs a ``relative_bias`` and consecutive positions."""
    return enc.bias(positions[-1:], positions, layer).float()[:, 0].flip(-1)


_BLOCK_MASKS: dict = {}  # (T, window, device) -> the causal BlockMask, built once per process


def causal_block_mask(T: int, window: int, device, cache: dict | None = None):
    """Flex attention's block mask of causal attention at T tokens, key j seen by query i where
    j <= i (and i - j < ``window`` where one is set): blocks with no seen pair are skipped.
    Built once per process; inside a compiled model once per forward pass (in ``cache``), as
    part of the graph: a graph reading the process-wide dict would be guarded on its contents
    and compiled again when it changed (after its own first call added the mask)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def build():
        def seen(b, h, i, j):
            return (i >= j) & (i - j < window) if window else i >= j

        return create_block_mask(seen, None, None, T, T, device=device)

    if torch.compiler.is_compiling():
        return _shared({} if cache is None else cache, f"block_mask{window}", build)
    return _shared(_BLOCK_MASKS, (T, window, str(device)), build)


_COMPILED_FLEX = []  # torch.compile(flex_attention), made at the first CUDA call


def _flex_kernel(q: torch.Tensor):
    """flex_attention as called here: traced as it is inside a compiled model; compiled once per
    process on CUDA (static shapes); else flex's eager reference, which materialises the scores
    and serves tests on small shapes."""
    from torch.nn.attention.flex_attention import flex_attention

    if torch.compiler.is_compiling() or q.device.type != "cuda":
        return flex_attention
    if not _COMPILED_FLEX:
        _COMPILED_FLEX.append(torch.compile(flex_attention, dynamic=False))
    compiled = _COMPILED_FLEX[0]

    def call(*args, **kwargs):  # an evaluation ladder meets more shapes than dynamo's default 8
        with torch._dynamo.config.patch(recompile_limit=FLEX_RECOMPILES):
            return compiled(*args, **kwargs)
    return call


def flex_causal(q, k, v, enc: PositionEncoding, positions, layer: int, cache: dict, window: int = 0):
    """Causal attention with a relative bias added inside flex attention's kernel: the logit of
    (i, j) is scale q_i.k_j + table[h, i - j] (:func:`distance_table`, built once per forward
    pass when the bias is the same in every layer), blocks above the diagonal (and outside the
    window) skipped by :func:`causal_block_mask`."""
    if enc.layer_invariant_bias:
        table = _shared(cache, "flex_table", lambda: distance_table(enc, positions, layer))
    else:
        table = distance_table(enc, positions, layer)

    def add_bias(score, b, h, i, j):  # j > i is masked; clamped so no index falls outside the table
        return score + table[h, (i - j).clamp(min=0)]

    mask = causal_block_mask(q.shape[2], window, q.device, cache)
    return _flex_kernel(q)(q, k, v, score_mod=add_bias, block_mask=mask, scale=enc.logit_scale())


def layer_window(enc: PositionEncoding, layer: int, window: int = 0) -> int:
    """The sliding window of ``layer``: the narrower of ``window`` (``model.window``) and the
    encoding's ``attention_window(layer)``; 0 where neither has one."""
    return min([w for w in (window, enc.attention_window(layer)) if w], default=0)


def cumulative_decay(enc: PositionEncoding, x: torch.Tensor, layer: int) -> torch.Tensor | None:
    """``causal_attention``'s ``decay`` for the layer input ``x`` (B, T, D): the encoding's log
    forget gates summed over the sequence in fp32 (B, H, T); None without a ``decay`` hook."""
    return enc.decay(x, layer).float().cumsum(-1) if "decay" in enc.hooks() else None


def token_transforms(enc: PositionEncoding, x: torch.Tensor, layer: int):
    """``causal_attention``'s ``transition`` for the layer input ``x`` (B, T, D): the encoding's
    (w, beta); None without a ``transition`` hook."""
    return enc.transition(x, layer) if "transition" in enc.hooks() else None


def _rows(chunk_size: int, per_row: int) -> int:
    """Query rows per chunk: ``chunk_size``, fewer when rows of ``per_row`` elements would
    exceed ``ATTN_BUDGET``."""
    return max(1, min(chunk_size, ATTN_BUDGET // per_row))


def _shared(cache: dict, key: str, build):
    if key not in cache:
        cache[key] = build()
    return cache[key]


def _contiguous(cache: dict, positions: torch.Tensor) -> bool:
    """Whether the positions are consecutive integers (an offset arange), as the model says in
    ``cache["contiguous"]``; else read once from the positions (strictly increasing integers
    are consecutive when the last is T - 1 past the first)."""
    if "contiguous" not in cache:
        cache["contiguous"] = int(positions[-1] - positions[0]) == len(positions) - 1
    return cache["contiguous"]


def _future(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int = 0) -> torch.Tensor:
    """(Tq, Tk) True where the query does not see the key: j > i, and with a ``window`` i - j >= window."""
    hidden = k_pos[None, :] > q_pos[:, None]
    if window:
        hidden = hidden | (q_pos[:, None] - k_pos[None, :] >= window)
    return hidden


def _causal_mask(positions: torch.Tensor, dtype, window: int = 0, s: int = 0, e: int | None = None) -> torch.Tensor:
    """(e - s, e): 0 where query [s, e) sees key [0, e), -inf elsewhere (default: every query)."""
    e = len(positions) if e is None else e
    zeros = torch.zeros(e - s, e, device=positions.device)
    return zeros.masked_fill(_future(positions[s:e], positions[:e], window), float("-inf")).to(dtype)


def masked_bias(enc, q_pos, k_pos, layer, dtype, window: int = 0) -> torch.Tensor:
    bias = enc.bias(q_pos, k_pos, layer).float()  # (H, Tq, Tk)
    return bias.masked_fill(_future(q_pos, k_pos, window), float("-inf")).to(dtype)[None]


def _explicit(q, k, v, mask, scale):
    """Softmax attention with an additive mask (already holding -inf above the diagonal)."""
    logits = ((q * scale) @ k.transpose(-2, -1)).float() + mask  # scaling q: (T, hs), not (T, T)
    return logits.softmax(dim=-1).to(v.dtype) @ v


def _toeplitz(enc, positions, layer, chunk, dtype, window: int = 0) -> torch.Tensor:
    """(1, H, chunk, T): the masked bias of the last ``chunk`` queries against all T keys,
    built in row blocks of at most ``ATTN_BUDGET`` fp32 elements."""
    T = len(positions)
    q_pos = positions[T - chunk:]
    table = torch.empty(1, enc.dims.n_heads, chunk, T, dtype=dtype, device=positions.device)
    step = _rows(chunk, enc.pair_cost() * T)
    for r in range(0, chunk, step):
        table[:, :, r:r + step] = masked_bias(enc, q_pos[r:r + step], positions, layer, dtype, window)
    return table


def _toeplitz_slice(table: torch.Tensor, T: int, s: int, e: int) -> torch.Tensor:
    """The bias of queries [s, e) against keys [0, e) as a view of ``table``: its row r0 + r is
    query position T - chunk + r0 + r and its column c0 + j key position c0 + j, so
    c0 = T - chunk + r0 - s makes every difference i - j equal (s + r) - j."""
    chunk = table.shape[2]
    r0 = max(0, s - (T - chunk))
    c0 = T - chunk + r0 - s
    return table[:, :, r0:r0 + e - s, c0:c0 + e]


def biased_sdpa(q, k, v, mask, scale):
    """SDPA with a float mask, under :data:`SDPA_BIAS`'s backend order on CUDA
    (:mod:`posbench.runs.kernels`: cuDNN's fused attention takes an additive bias, where torch
    would pick the memory-efficient kernel, a candidate for the static biases' speed on a GPU
    chosen by measurement); torch's own order elsewhere."""
    if SDPA_BIAS and q.is_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([getattr(SDPBackend, name) for name in SDPA_BIAS], set_priority=True):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def fused_causal(q, k, v, scale):
    """SDPA's causal kernel. Where an encoding widens q and k past the values' head dim (PoPE's
    2d), the values are padded with zeros to it and the output cut back; where the values are the
    wider (position features carried with them, the ``features`` hook), q and k are padded, which
    changes no logit: SDPA's fused kernels take one head dim, and would otherwise fall back to a
    (T, T) matrix."""
    pad = q.shape[-1] - v.shape[-1]
    if pad < 0:
        q, k = F.pad(q, (0, -pad)), F.pad(k, (0, -pad))
    if pad <= 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    return F.scaled_dot_product_attention(q, k, F.pad(v, (0, pad)), is_causal=True, scale=scale)[..., :v.shape[-1]]


def _chunks(T: int, rows: int) -> list[tuple[int, int]]:
    """Query chunks [s, e), the last (longest key range) first: each chunk's tensors then fit
    in the blocks the previous one freed, so the heap is reused instead of growing."""
    return [(s, min(T, s + rows)) for s in reversed(range(0, T, rows))]


def sdpa_chunks(q, k, v, rows, scale, mask_of):
    outs = [biased_sdpa(q[:, :, s:e], k[:, :, :e], v[:, :, :e], mask_of(s, e), scale)
            for s, e in _chunks(q.shape[2], rows)]
    return torch.cat(outs[::-1], dim=2)


def _decay_mask(decay: torch.Tensor, q_pos, k_pos, s: int, e: int, window: int = 0) -> torch.Tensor:
    """(B, H, e - s, e): c_i - c_j for queries [s, e) and keys [0, e), -inf where not seen (fp32)."""
    mask = decay[:, :, s:e, None] - decay[:, :, None, :e]
    return mask.masked_fill(_future(q_pos, k_pos, window), float("-inf"))


def _decay_chunks(q, k, v, enc, positions, layer, chunk_size, decay, explicit, window=0):
    """SDPA per query chunk with the decay mask (B, H, rows, keys), plus the encoding's bias, if any."""
    B, H, T, _ = q.shape
    biased = "bias" in enc.hooks()
    rows = _rows(chunk_size, B * H * T * (2 if biased else 1))

    def mask_of(s, e):
        mask = _decay_mask(decay, positions[s:e], positions[:e], s, e, window)
        if biased:
            mask = mask + enc.bias(positions[s:e], positions[:e], layer).float()
        return mask.to(q.dtype)

    if explicit and rows >= T:
        return _explicit(q, k, v, mask_of(0, T), enc.logit_scale())
    return sdpa_chunks(q, k, v, rows, enc.logit_scale(), mask_of)


def _explicit_chunks(q, k, v, enc, positions, layer, chunk_size, decay=None, window=0, sink=None):
    """Attention one query chunk at a time, every hook's term added to explicit fp32 logits. ``sink``:
    (H,) logits of a key every query sees with no value (gpt-oss's learned sinks, as transformers'
    ``GptOssAttention``: a column concatenated to the logits before the softmax, dropped after it)."""
    hooks, scale = enc.hooks(), enc.logit_scale()
    outs = []
    for start, end in _chunks(q.shape[2], chunk_size):
        q_pos, k_pos = positions[start:end], positions[:end]
        qc, kc, vc = q[:, :, start:end], k[:, :, :end], v[:, :, :end]
        logits = (qc @ kc.transpose(-2, -1)).float()  # (B, H, Tq, Tk)
        if "score" in hooks:
            logits = logits + enc.score(qc, kc, q_pos, k_pos, layer).float()
        logits = logits * scale
        if "bias" in hooks:
            logits = logits + enc.bias(q_pos, k_pos, layer).float()
        if decay is not None:
            logits = logits + _decay_mask(decay.float(), q_pos, k_pos, start, end)
        hidden = _future(q_pos, k_pos, window)
        if "normalize" in hooks:  # weights other than softmax's; what they leave goes to the query's own value
            probs = enc.normalize(logits, q_pos, k_pos, hidden, layer)
            rest = 1 - probs.sum(-1, keepdim=True)
            out = probs.to(vc.dtype) @ vc + (rest * v[:, :, start:end].float()).to(vc.dtype)
        elif sink is not None:
            column = sink.float().view(1, -1, 1, 1).expand(*logits.shape[:-1], 1)
            probs = torch.cat((logits.masked_fill(hidden, float("-inf")), column), dim=-1).softmax(dim=-1)[..., :-1]
            out = probs.to(vc.dtype) @ vc
        else:
            probs = logits.masked_fill(hidden, float("-inf")).softmax(dim=-1)
            out = probs.to(vc.dtype) @ vc
        if "value" in hooks:
            out = out + enc.value(probs, q_pos, k_pos, layer).to(out.dtype)
        outs.append(out)
    return torch.cat(outs[::-1], dim=2)


def reference_attention(q, k, v, enc: PositionEncoding, positions: torch.Tensor, layer: int = 0,
                        decay: torch.Tensor | None = None, window: int = 0, transition=None, sink=None):
    """Plain full-matrix attention in fp32, for tests comparing kernels (with a ``transition``: the
    Householder form in one chunk of every token)."""
    if transition is not None:
        return householder_attention(q.float(), k.float(), v.float(), *transition, enc.logit_scale(), positions, decay,
                                     window, chunk=q.shape[2])
    return _explicit_chunks(q.float(), k.float(), v.float(), enc, positions, layer,
                            chunk_size=q.shape[2], decay=decay, window=window, sink=sink)
