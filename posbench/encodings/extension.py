"""Training-free context extension of rotary models at the attention: Self-Extend, ReRoPE, log-n,
Llama 3's RoPE scaling, STRING, attention sinks (StreamingLLM), LM-Infinite, Dual Chunk Attention.

Each changes which positions the rotary angles of a query-key pair use, which keys a query sees,
the rotary frequencies, or the scale of q and k, at inference only; the weights stay as trained.
For a query at position i and a key at j <= i (d = i - j), with q and k the projections before
rotation, R(p) the rotation by p, L the trained context (``train_len``) and T the window:

* **Self-Extend** (Jin et al. 2024, "LLM Maybe LongLM", datamllab/LongLM; neighbour window W,
  group size G): d < W: R(i)q . R(j)k as trained; d >= W: R(i // G + W - W // G)q . R(j // G)k,
  so far keys are seen at grouped distances that stay within what the model trained on.
* **ReRoPE** (Su 2023, bojone/rerope; window W): d < W as trained; d >= W: R(W)q . k, the
  relative position clipped at W.
* **log-n** (Chiang & Cholak 2022; Qwen's ``use_logn_attn``): q times max(1, log_{L} (i + 1)),
  so attention stays as sharp over more keys; the factor is :func:`logn_factor`, the one
  posbench's own models train with (``model.length_scaling=logn``, :mod:`posbench.model.length_scaling`).
* **llama3** (Meta 2024, "The Llama 3 Herd of Models"; ``apply_scaling`` in meta-llama/llama-models,
  Hugging Face ``rope_type: llama3``): every pair as trained, on new frequencies
  (:func:`llama3_inv_freq`): with wavelength lambda = 2 pi / theta, theta kept where
  lambda < L / 4, theta / s where lambda > L, and between them (1 - a) theta / s + a theta
  with a = (L / lambda - 1) / (4 - 1) (low_freq_factor 1, high_freq_factor 4, the original
  context L). s is ``factor``, or max(1, T / L) per window when None (as ``eval.rope_factor``
  null for the RoPE scalings). On a model whose own config already scales its RoPE, it scales
  the frequencies the model has.
* **STRING** (An et al. 2024, "Why Does the Effective Context Length of LLMs Fall Short?",
  HKUNLP/STRING; shifted offset S = ``window``, local value W = ``group``): d < S as trained;
  d >= S: R(i - S + W)q . R(j)k, the distance d - S + W, so the far keys reuse the small, well
  trained distances. As the reference (``string_for_llama.py``), q and k are both multiplied by
  0.1 ln 2 + 1 (its ``attention_factor`` on cos and sin). Defaults: S = int(0.33 L) (its
  README's ``shifted_offset``), W = 128 (``small_local_value``), capped at S // 4 (at least 1)
  for short contexts. The reference's near part is a flash window of S + 1 keys (d <= S), so its key at d = S is counted
  in both parts; here each key is in one.
* **sinks** (StreamingLLM; Xiao et al., ICLR 2024, "Efficient Streaming Language Models with
  Attention Sinks", mit-han-lab/streaming-llm; n sinks = ``group``, W = ``window`` recent keys
  counting the query): query i sees the keys j < n and those at d < W; positions are the ones
  the reference's cache assigns (``enable_pos_shift``: a key at its index in the cache of
  ``start_size`` = n plus ``recent_size`` = W - 1 keys, the query after them): d < W as trained;
  a sink j < n at d >= W: R(min(i, n + W - 1))q . R(j)k. For a full window's perplexity this
  is exactly the reference's token-by-token streaming evaluation (``eval_long_ppl.py``) started
  at the window's first token: every query attends to the cache the reference would hold when
  it is decoded. Defaults: n = 4 (the reference's ``start_size``), W = L - n (the cache and the
  query fill the trained context).
* **LM-Infinite** (Han et al., NAACL 2024, "LM-Infinite: Zero-Shot Extreme Length
  Generalization for Large Language Models", Glaciohound/LM-Infinite; n_global = ``group``,
  local branch W = ``window``): the Lambda-shaped mask, query i seeing the keys j < n_global and
  those at d < W; d < W as trained; a starting key at d >= W: R(min(L, T - 1))q . k, its distance
  capped at ``limit_distance`` = L (the reference rotates such a query by the limit and leaves
  the starting keys unrotated). Defaults: W = L and n_global = 10 (its README's perplexity runs).
* **Dual Chunk Attention** (``dca``; An et al., ICML 2024, "Training-Free Long-Context Scaling
  of Large Language Models", HKUNLP/ChunkLlama; chunk size C = ``window``, local window
  w = ``group``): the sequence cut into chunks of c = C - w tokens, every key at position j mod c;
  the query at i mod c for a key in its own chunk (intra-chunk), at min(i mod c + c, C) for a
  key in the chunk before (successive-chunk) and at min(2c - 1, C) for any earlier one
  (inter-chunk); past L, q and k times 0.05 ln(T / L) + 1 (the reference's ``get_mscale`` on
  cos and sin). Defaults: C = 3L // 4, w = L // 8 (``replace_with_chunkllama``).

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
:func:`direct_logits` is the definitions above written out pair by pair, which the tests hold it
to. Hugging Face models use it through transformers' attention interface
(:func:`hf_attention`): the q and k it receives are already rotated by positions 0..T-1, so it
rotates them back first. posbench's own models use it inside :meth:`PositionEncoding.extended
<posbench.encodings.base.PositionEncoding.extended>`: the attention layer hands a method that
sets positions (:attr:`Extension.sets_positions`) its q and k before rotation, with the
encoding's frequencies, and scales the rotated queries for log-n (any encoding); a method that
sets positions but reaches the ordinary kernel instead stops there with one line
(:func:`posbench.model.attention.causal_attention`), never giving the numbers as trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..errors import PosbenchError
from .rotation import rotate

METHODS = ("none", "self_extend", "rerope", "logn", "llama3", "string", "sinks", "lm_infinite", "dca")
LLAMA3_LOW_FREQ_FACTOR, LLAMA3_HIGH_FREQ_FACTOR = 1.0, 4.0  # Meta's apply_scaling and HF's defaults
STRING_FACTOR = 0.1 * math.log(2) + 1  # the reference's attention_factor on cos and sin
STRING_LOCAL = 128  # the reference's small_local_value
ONE_ATTENTION_METHODS = ("none", "logn", "llama3")  # one fused causal attention: no position moves
PARTS_METHODS = ("string", "sinks", "lm_infinite", "dca")  # computed from their parts (Extension.parts)
# queries per fused call of the parts path: its mask is (block, keys) fp32. At SmolLM2's shapes, 8k
# tokens, one STRING layer took 7.9, 5.1, 3.4 and 4.1 s at 512, 1,024, 2,048 and 4,096 (one run,
# beside a busy process): each call's fixed work is paid T / block times
FUSED_BLOCK = 2048
SINKS = {"sinks": 4, "lm_infinite": 10}  # start_size (streaming-llm), global_branch (LM-Infinite's README)
# what eval.extension_window and eval.extension_group are for each method, for labels and errors
PARAMS = {"self_extend": ("W", "G"), "rerope": ("W", None), "string": ("S", "W"), "sinks": ("W", "n"),
          "lm_infinite": ("W", "n"), "dca": ("C", "w")}


def logn_factor(n: torch.Tensor, train_len: int) -> torch.Tensor:
    """max(1, log n / log ``train_len``) for key counts ``n`` (any shape, float): the ``logn``
    method's factor on the query, and the one :mod:`posbench.model.length_scaling` trains with."""
    if train_len < 2:
        raise PosbenchError(f"log-n scaling needs a training length >= 2 (log base), got {train_len}")
    return torch.clamp(torch.log(n.float()) / math.log(train_len), min=1.0)


@dataclass(frozen=True)
class Part:
    """Some of the (query, key) pairs of a method and their rotary positions: the query at
    ``q_pos[i]``, the key at ``k_pos[j]`` (both (T,)), for the pairs where ``holds(i, j)`` ((Tq, 1)
    and (1, Tk) -> bool); ``keys(s, e)``: a key range [lo, hi) holding every pair of queries
    [s, e), so a query chunk scores no more keys than it needs."""

    q_pos: torch.Tensor
    k_pos: torch.Tensor
    holds: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    keys: Callable[[int, int], tuple[int, int]]


@dataclass(frozen=True)
class Extension:
    """A method and its parameters (``eval.extension``, ``eval.extension_window``,
    ``eval.extension_group``; what each means for each method: the module docstring and
    :data:`PARAMS`); ``train_len``: the model's trained context; ``factor``: llama3's s (None:
    max(1, T / train_len) per window). A parameter left None takes its reference's default."""

    method: str = "none"
    window: int | None = None
    group: int | None = None
    train_len: int = 0
    factor: float | None = None

    def __post_init__(self):
        if self.method not in METHODS:
            raise PosbenchError(f"eval.extension={self.method!r} is not valid; valid choices: {', '.join(METHODS)}")
        if self.method in ("self_extend", "rerope") and not (self.window and self.window > 0):
            raise PosbenchError(f"eval.extension={self.method} needs eval.extension_window > 0 (the neighbour "
                                f"window W), got {self.window}; e.g. eval.extension_window=512")
        if self.method == "self_extend" and not (self.group and self.group > 1):
            raise PosbenchError(f"eval.extension=self_extend needs eval.extension_group > 1 (the group size G), got "
                                f"{self.group}; e.g. eval.extension_group=8")
        if self.factor is not None and not self.factor >= 1:
            raise PosbenchError(f"llama3's factor must be >= 1 (1 = no scaling) or None (T / train_len), "
                                f"got {self.factor}")
        if self.method in ("string", "sinks", "lm_infinite", "dca"):
            window, group = self._defaults()
            object.__setattr__(self, "window", window)
            object.__setattr__(self, "group", group)
            self._check_sizes()

    def _defaults(self) -> tuple[int, int]:
        """(window, group) with the references' defaults where None (module docstring)."""
        L, window, group = self.train_len, self.window, self.group
        if self.method == "string":
            window = window if window is not None else int(0.33 * L)
            return window, group if group is not None else max(1, min(STRING_LOCAL, window // 4))
        if self.method in ("sinks", "lm_infinite"):
            group = group if group is not None else SINKS[self.method]
            return (window if window is not None else (L - group if self.method == "sinks" else L)), group
        return (window if window is not None else 3 * L // 4), group if group is not None else L // 8  # dca

    def _check_sizes(self) -> None:
        big, small = PARAMS[self.method]
        bad = {"string": not 0 < self.group < self.window, "sinks": not (self.window > 0 and self.group >= 0),
               "lm_infinite": not (self.window > 0 and self.group >= 0),
               "dca": not 0 <= self.group < self.window}[self.method]
        if bad:
            need = {"string": f"0 < {small} < {big} (the local value below the shifted offset)",
                    "dca": f"0 <= {small} < {big} (the local window inside the chunk)"}.get(
                self.method, f"{big} > 0 recent keys and {small} >= 0 starting keys")
            raise PosbenchError(f"eval.extension={self.method} needs {need}: eval.extension_window={big}, "
                                f"eval.extension_group={small}; got {self.window} and {self.group} "
                                f"(train_len {self.train_len})")

    @property
    def label(self) -> str:
        """How results rows name it: ``self_extend(W=512,G=8)``, ``rerope(W=512)``, ``logn``,
        ``llama3`` (``llama3(s=8)`` at a fixed factor), ``string(S=21,W=5)``, ``sinks(W=60,n=4)``,
        ``lm_infinite(W=64,n=10)``, ``dca(C=48,w=8)``."""
        if self.method == "llama3":
            return "llama3" if self.factor is None else f"llama3(s={self.factor:g})"
        if self.method not in PARAMS:
            return self.method
        names = [(name, value) for name, value in zip(PARAMS[self.method], (self.window, self.group)) if name]
        return f"{self.method}({','.join(f'{name}={value}' for name, value in names)})"

    @property
    def sets_positions(self) -> bool:
        """Whether the method sets the rotary positions or frequencies of the attention itself (all
        but ``none`` and ``logn``): it runs on the q and k before rotation, on encodings whose
        positions are a pure rotation (``regroupable``), and computes the whole attention."""
        return self.method not in ("none", "logn")

    def identity_at(self, length: int) -> bool:
        """Whether the method leaves the model as trained on windows of ``length`` tokens: every
        distance inside the window (Self-Extend, ReRoPE, LM-Infinite), every key seen (sinks), one
        chunk inside the trained context (DCA), s = 1 (llama3), every query inside the trained
        context (log-n); never STRING, whose factor scales every logit."""
        if self.method in ("self_extend", "rerope", "lm_infinite"):
            return length <= self.window
        if self.method == "sinks":
            return length <= self.group + self.window
        if self.method == "dca":
            return length <= min(self.window - self.group, self.train_len)
        if self.method == "llama3":
            return length <= self.train_len if self.factor is None else self.factor == 1
        return self.method == "none" or (self.method == "logn" and length <= self.train_len)

    def positions(self, i: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(query position, key position) of Self-Extend's and ReRoPE's far pairs (d >= W) for
        queries ``i`` (Tq, 1) and keys ``j`` (1, Tk)."""
        if self.method == "self_extend":
            return i // self.group + self.window - self.window // self.group, j // self.group
        return torch.full_like(i, self.window), torch.zeros_like(j)  # rerope

    def check_scaling(self, kind: str) -> None:
        """One line unless the method runs beside RoPE scaling ``kind``: log-n scales the queries
        and takes any scaling (``yarn+logn``); the others set the positions or frequencies of the
        rotation themselves, on the trained frequencies, so they take none."""
        if self.sets_positions and kind != "none":
            what = "frequencies" if self.method == "llama3" else "positions"
            raise PosbenchError(f"eval.extension={self.method} sets the rotary {what} itself, on the trained "
                                f"frequencies, so it takes no eval.rope_scaling (got {kind}); valid with it: "
                                "eval.rope_scaling=none (eval.extension=logn takes any scaling)")

    def query_scale(self, i: torch.Tensor) -> torch.Tensor:
        """log-n's factor per query position (ones for the other methods)."""
        if self.method != "logn":
            return torch.ones_like(i, dtype=torch.float32)
        return logn_factor(i + 1, self.train_len)

    def attention_factor(self, T: int) -> float:
        """The factor on q and on k (so the logits scale by its square) at a window of T: STRING's
        0.1 ln 2 + 1, DCA's 0.05 ln(T / L) + 1 past L; 1 for the others."""
        if self.method == "string":
            return STRING_FACTOR
        if self.method == "dca" and T > self.train_len:
            return 0.05 * math.log(T / self.train_len) + 1.0
        return 1.0

    def frequencies(self, inv_freq: torch.Tensor, T: int) -> torch.Tensor:
        """The rotary frequencies the method rotates with at a window of T: llama3's from the
        trained ``inv_freq`` (:func:`llama3_inv_freq`), the trained ones for the others."""
        if self.method != "llama3":
            return inv_freq
        s = self.factor if self.factor is not None else max(1.0, T / self.train_len)
        return llama3_inv_freq(inv_freq, s, self.train_len)

    def visible(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """The mask hook: which keys ``j`` (1, Tk) each query ``i`` (Tq, 1) sees -> (Tq, Tk) bool.
        j <= i for every method; sinks and LM-Infinite see only the first n keys and the last W."""
        seen = j <= i
        if self.method in ("sinks", "lm_infinite"):
            seen = seen & ((j < self.group) | (i - j < self.window))
        return seen

    def parts(self, T: int, device=None) -> list[Part]:
        """The method's pairs in disjoint parts, each with its rotary positions (:class:`Part`);
        the union of the parts' pairs within :meth:`visible` is every visible pair."""
        pos = torch.arange(T, device=device)
        near = lambda W: Part(pos, pos, lambda i, j: i - j < W, lambda s, e: (max(0, s - W + 1), e))  # noqa: E731
        if self.method in ("self_extend", "rerope"):
            W = self.window
            q_far, k_far = self.positions(pos, pos)
            return [near(W), Part(q_far, k_far, lambda i, j: i - j >= W, lambda s, e: (0, max(0, e - W)))]
        if self.method == "string":
            S, W = self.window, self.group
            return [near(S), Part(pos - S + W, pos, lambda i, j: i - j >= S, lambda s, e: (0, max(0, e - S)))]
        if self.method in ("sinks", "lm_infinite"):
            W, n = self.window, self.group
            if self.method == "sinks":  # a sink's place in the reference's cache: the query after n + W - 1 keys
                q_far, k_far = pos.clamp(max=n + W - 1), pos
            else:  # LM-Infinite: distance capped at the trained length, starting keys unrotated
                q_far, k_far = torch.full_like(pos, min(self.train_len, T - 1)), torch.zeros_like(pos)
            return [near(W), Part(q_far, k_far, lambda i, j: (i - j >= W) & (j < n), lambda s, e: (0, min(n, e)))]
        if self.method == "dca":
            return self._chunk_parts(pos)
        return [Part(pos, pos, lambda i, j: j <= i, lambda s, e: (0, e))]  # llama3: positions as trained

    def _chunk_parts(self, pos: torch.Tensor) -> list[Part]:
        """DCA's intra-chunk, successive-chunk and inter-chunk parts (module docstring)."""
        C, w = self.window, self.group
        c = C - w
        k_pos = pos % c
        succ_q = (pos % c + c).clamp(max=C)
        inter_q = torch.full_like(pos, min(2 * c - 1, C))
        return [Part(pos % c, k_pos, lambda i, j: i // c == j // c, lambda s, e: (s // c * c, e)),
                Part(succ_q, k_pos, lambda i, j: i // c == j // c + 1,
                     lambda s, e: (max(0, (s // c - 1) * c), (e - 1) // c * c)),
                Part(inter_q, k_pos, lambda i, j: i // c > j // c + 1,
                     lambda s, e: (0, max(0, ((e - 1) // c - 1) * c)))]


def llama3_inv_freq(inv_freq: torch.Tensor, factor: float, original_len: int,
                    low_freq_factor: float = LLAMA3_LOW_FREQ_FACTOR,
                    high_freq_factor: float = LLAMA3_HIGH_FREQ_FACTOR) -> torch.Tensor:
    """Llama 3's RoPE scaling of the frequencies ``inv_freq`` (Meta 2024; ``apply_scaling`` in
    meta-llama/llama-models, Hugging Face ``_compute_llama3_parameters``): with lambda = 2 pi / theta
    and L = ``original_len``, theta where lambda < L / high_freq_factor, theta / s where
    lambda > L / low_freq_factor, else (1 - a) theta / s + a theta, a = (L / lambda -
    low_freq_factor) / (high_freq_factor - low_freq_factor). A zero frequency (a pair without
    positions) stays zero. -> the shape of ``inv_freq``."""
    theta = inv_freq.float()
    wavelen = 2 * math.pi / theta
    smooth = (original_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    mid = (1 - smooth) * theta / factor + smooth * theta
    out = torch.where(wavelen > original_len / low_freq_factor, theta / factor, mid)
    return torch.where(wavelen < original_len / high_freq_factor, theta, out)


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
    if ext.method in PARTS_METHODS:
        if flash:
            return _fused_parts(qs, k.float(), v, freq, ext, scaling, block or FUSED_BLOCK)
        return parts_attention(qs, k.float(), v, freq, ext, scaling, chunk)
    if flash and ext.method in ("self_extend", "rerope"):
        return _two_fused(qs, k.float(), v, pos, freq, ext, scaling, groups)  # rotates q and k itself
    k_near = rotate(k.float(), pos[:, None] * freq)
    if ext.method in ONE_ATTENTION_METHODS:
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
