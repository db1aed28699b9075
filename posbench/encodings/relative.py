"""Relative position terms that need q and k themselves (``score``/``value`` hooks).

Every scheme here has the same shape: a small table of vectors indexed by a relative
id (a clipped offset, or a distance), a matmul of each query (or key) with the whole
table, then a ``gather`` by the id of each (i, j) pair. Memory is (B, H, Tq, ids) plus
(B, H, Tq, Tk), never (Tq, Tk, hs). i is the query position, j the key position.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import PosbenchError
from .absolute import sinusoid_table
from .base import ModelDims, PositionEncoding, register
from .span import distance_range


def gather_relative(by_id: torch.Tensor, rel_id: torch.Tensor) -> torch.Tensor:
    """by_id: (B, H, Tq, N) a term per relative id, rel_id: (Tq, Tk) ids -> (B, H, Tq, Tk)."""
    B, H = by_id.shape[:2]
    return by_id.gather(-1, rel_id.expand(B, H, *rel_id.shape))


def _offsets(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    return q_pos[:, None] - k_pos[None, :]  # (Tq, Tk), i - j


def _normal(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape) * 0.02)


def _even(name: str, dim: int) -> None:
    if dim % 2:
        raise PosbenchError(f"{name} needs an even sinusoid dimension, got {dim}")


@register
class Shaw(PositionEncoding):
    """Shaw et al. 2018, Self-Attention with Relative Position Representations.

    sec. 3.2:  a^K_ij = w^K_clip(j-i, k),  a^V_ij = w^V_clip(j-i, k),  clip(x, k) = max(-k, min(k, x));
    sec. 3.1:  e_ij = q_i (k_j + a^K_ij)^T / sqrt(d)   (``score``: q_i a^K_ij, scaled by the kernel),
               z_i = sum_j a_ij (v_j + a^V_ij)         (``value``: sum_j a_ij a^V_ij).

    Causal attention only sees offsets j - i in [-k, 0], so each table holds k + 1
    vectors; row r is offset -r (row k for every key k or more tokens back). Keys
    after the query (masked by the kernel) read row 0. Tables are shared by heads
    (sec. 3.3) and, as in the tensor2tensor code, one pair per layer.

    Reference: tensorflow/tensor2tensor ``tensor2tensor/layers/common_attention.py``
    (``_generate_relative_positions_embeddings``, ``dot_product_attention_relative``): the
    table is a plain ``tf.get_variable`` with no initializer of its own, so it takes the model's
    weight init, and a^K enters inside q (k + a^K) / sqrt(d) with no extra scale. This follows
    it: the tables take the model's init, N(0, 0.02) (GPT-2) as every weight here.
    """

    name = "shaw"
    paper = "Shaw et al. 2018, Self-Attention with Relative Position Representations"
    description = "learned key and value vectors per clipped offset, one pair of tables per layer"

    def __init__(self, dims: ModelDims, max_distance: int = 16):
        super().__init__(dims)
        self.max_distance = int(max_distance)
        if self.max_distance < 1:
            raise PosbenchError(f"shaw max_distance must be >= 1, got {max_distance}")
        self.key_table = _normal(dims.n_layers, self.max_distance + 1, dims.head_dim)    # w^K
        self.value_table = _normal(dims.n_layers, self.max_distance + 1, dims.head_dim)  # w^V

    def relative_id(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        return _offsets(q_pos, k_pos).clamp(0, self.max_distance)  # (Tq, Tk): -clip(j - i, k)

    def score(self, q, k, q_pos, k_pos, layer):
        by_id = q @ self.key_table[layer].to(q.dtype).T  # (B, H, Tq, k+1): q_i . w^K_r
        return gather_relative(by_id, self.relative_id(q_pos, k_pos)).float()  # q_i . a^K_ij

    def value(self, probs, q_pos, k_pos, layer):
        rel_id = self.relative_id(q_pos, k_pos)
        B, H, Tq, _ = probs.shape
        buckets = probs.new_zeros(B, H, Tq, self.max_distance + 1)  # sum of a_ij per id
        buckets = buckets.scatter_add(-1, rel_id.expand(B, H, *rel_id.shape), probs)
        return buckets @ self.value_table[layer].to(buckets.dtype)  # sum_j a_ij a^V_ij


@register
class TransformerXL(PositionEncoding):
    """Dai et al. 2019, Transformer-XL, sec. 3.3, without the segment recurrence:

    A_ij = q_i^T k_j  (a)  +  q_i^T W_R R_{i-j}  (b)  +  u^T k_j  (c)  +  v^T W_R R_{i-j}  (d)

    R is the fixed sinusoid table over distances (d_model wide; its sin/cos layout is
    absorbed by W_R). W_R (W_{k,R}^n) is per layer; u and v are per head and shared by
    layers, as the equation has no layer index on them. (b) + (d) = (q_i + v) W_R R_{i-j}
    is computed for every distance 0..max(i - j) in the chunk, then gathered. Keys after
    the query (masked by the kernel) read distance 0. Scaled by 1/sqrt(d_head) as in
    the reference code.

    Reference: kimiyoung/transformer-xl ``pytorch/mem_transformer.py``
    (``RelPartialLearnableMultiHeadAttn``; ``r_w_bias``, ``r_r_bias`` shared by layers unless
    ``untie_r``) with the init of ``pytorch/train.py`` ``weights_init``: N(0, ``init_std`` =
    0.02) for u, v and the r_net projection. This follows it unchanged.
    """

    name = "xl"
    paper = "Dai et al. 2019, Transformer-XL"
    description = "sinusoidal distances projected per layer, with global content and position biases u, v"

    def __init__(self, dims: ModelDims, base: float = 10000.0):
        super().__init__(dims)
        _even("xl", dims.d_model)
        self.base = float(base)
        self.r_proj = nn.ModuleList(nn.Linear(dims.d_model, dims.d_model, bias=False)
                                    for _ in range(dims.n_layers))  # W_{k,R} per layer
        for proj in self.r_proj:
            nn.init.normal_(proj.weight, std=0.02)
        self.u = _normal(dims.n_heads, dims.head_dim)  # content bias
        self.v = _normal(dims.n_heads, dims.head_dim)  # position bias

    def pair_cost(self) -> int:
        return 2 * self.dims.n_heads  # the (b)+(d) term by distance, then gathered

    def score(self, q, k, q_pos, k_pos, layer):
        distance = _offsets(q_pos, k_pos).clamp(min=0)  # (Tq, Tk)
        n = max(0, distance_range(q_pos, k_pos)[1]) + 1  # the largest clamped distance
        R = sinusoid_table(torch.arange(n, device=q.device), self.dims.d_model, self.base)  # (n, D)
        WR = self.r_proj[layer](R).view(n, self.dims.n_heads, -1).permute(1, 2, 0)  # (H, hs, n)
        bd = (q + self.v[:, None, :].to(q.dtype)) @ WR.to(q.dtype)  # (B, H, Tq, n): (b) + (d)
        c = self.u[:, None, :].to(k.dtype) @ k.transpose(-2, -1)  # (B, H, 1, Tk): (c)
        return gather_relative(bd, distance).float() + c.float()


@register
class DeBERTa(PositionEncoding):
    """He et al. 2021, DeBERTa: Decoding-enhanced BERT with Disentangled Attention, sec. 3.1.

    Q^r = P W_{q,r},  K^r = P W_{k,r},
    A_ij = Q^c_i K^c_j^T  (c2c)  +  Q^c_i K^r_{delta(i,j)}^T  (c2p)  +  K^c_j Q^r_{delta(j,i)}^T  (p2c),
    H_o = softmax(A / sqrt(3d)) V^c,
    delta(i, j) = 0 if i - j <= -k;  2k - 1 if i - j >= k;  i - j + k otherwise   (k = ``max_distance``).

    P (2k x d_model) is shared by all layers as in the paper; W_{q,r} and W_{k,r} are per
    layer (DeBERTa v1; v2's ``share_att_key`` would reuse W_q, W_k instead). d in
    sqrt(3d) is the head dimension. The default k = 64 is half the default training
    length, so the clipped ids are trained before evaluation goes past them.

    Reference: microsoft/DeBERTa ``DeBERTa/deberta/disentangled_attention.py`` and
    ``bert.py`` (``rel_embeddings`` an ``nn.Embedding``, ``pos_proj`` / ``pos_q_proj``
    linear), all initialised by ``init_weights`` at N(0, ``initializer_range`` = 0.02), the
    scores divided by sqrt(d * 3) with no other scale. This follows it unchanged.
    """

    name = "deberta"
    paper = "He et al. 2021, DeBERTa (disentangled attention)"
    description = "content-to-position and position-to-content terms over clipped offsets, 1/sqrt(3d)"

    def __init__(self, dims: ModelDims, max_distance: int = 64):
        super().__init__(dims)
        self.max_distance = int(max_distance)
        if self.max_distance < 1:
            raise PosbenchError(f"deberta max_distance must be >= 1, got {max_distance}")
        self.rel_embeddings = _normal(2 * self.max_distance, dims.d_model)  # P, shared by layers

        def projections():
            layers = nn.ModuleList(nn.Linear(dims.d_model, dims.d_model, bias=False) for _ in range(dims.n_layers))
            for proj in layers:
                nn.init.normal_(proj.weight, std=0.02)
            return layers

        self.pos_key, self.pos_query = projections(), projections()  # W_{k,r}, W_{q,r} per layer

    def delta(self, offset: torch.Tensor) -> torch.Tensor:
        return (offset + self.max_distance).clamp(0, 2 * self.max_distance - 1)  # delta, offset = i - j

    def _project(self, proj: nn.Linear) -> torch.Tensor:
        return proj(self.rel_embeddings).view(2 * self.max_distance, self.dims.n_heads, -1).permute(1, 2, 0)

    def pair_cost(self) -> int:
        return 3 * self.dims.n_heads  # c2p and p2c, each in the matmul dtype and in fp32

    def score(self, q, k, q_pos, k_pos, layer):
        Kr = self._project(self.pos_key[layer]).to(q.dtype)  # (H, hs, 2k)
        Qr = self._project(self.pos_query[layer]).to(k.dtype)  # (H, hs, 2k)
        c2p = gather_relative(q @ Kr, self.delta(_offsets(q_pos, k_pos)))  # (B, H, Tq, Tk)
        # p2c_ij = (k_j Q^r^T)[j, delta(j, i)]: gather from the flattened (Tk * 2k) axis,
        # so the result comes out (Tq, Tk) contiguous without a transpose
        by_key = (k @ Qr).flatten(-2)  # (B, H, Tk * 2k)
        flat_id = torch.arange(len(k_pos), device=k.device)[None, :] * 2 * self.max_distance \
            + self.delta(_offsets(k_pos, q_pos)).T  # (Tq, Tk)
        p2c = gather_relative(by_key[:, :, None], flat_id.flatten()[None]).view_as(c2p)  # (B, H, Tq, Tk)
        return c2p.float() + p2c.float()

    def logit_scale(self) -> float:
        return (3 * self.dims.head_dim) ** -0.5


@register
class TENER(PositionEncoding):
    """Yan et al. 2019, TENER: Adapting Transformer Encoder for Named Entity Recognition, sec. 3.2.

    R_{t-j} = [..., sin((t-j) c_i), cos((t-j) c_i), ...],  c_i = 10000^(-2i/d_k),
    A_tj = Q_t K_j^T + Q_t R_{t-j}^T + u K_j^T + v R_{t-j}^T,
    Attn = softmax(A) V, un-scaled (``scaled: true`` divides A by sqrt(d_k) as in Vaswani et al.).

    R is not projected and is d_k = head_dim wide; its sin entries are odd in t - j,
    so R_t != R_{-t} (direction-aware) while cos entries are even. Distances are kept
    signed over the chunk's whole range, so the hook is exact for any positions. u and
    v are per head and, as in the authors' code, per layer. K itself is projected here
    (the model's shared attention), whereas the paper leaves K unprojected.

    Init: the authors' code (fastnlp/TENER ``modules/relative_transformer.py``
    ``RelativeMultiHeadAttn``) draws u and v (``r_w_bias``, ``r_r_bias``) with
    ``nn.init.xavier_normal_`` on an (n_head, head_dim) tensor, N(0, 2 / (H + head_dim)); this
    is the default (``init_std: null``). A number draws N(0, init_std) instead (0.02 was this
    project's former default).
    """

    name = "tener"
    paper = "Yan et al. 2019, TENER"
    description = "unprojected direction-aware sinusoidal offsets with biases u, v; unscaled logits"

    def __init__(self, dims: ModelDims, scaled: bool = False, base: float = 10000.0,
                 init_std: float | None = None):
        super().__init__(dims)
        _even("tener", dims.head_dim)
        self.scaled, self.base = bool(scaled), float(base)
        self.init_std = None if init_std is None else float(init_std)
        xavier = (2.0 / (dims.n_heads + dims.head_dim)) ** 0.5  # xavier_normal_ on (H, hs)
        std = xavier if init_std is None else float(init_std)
        if std < 0:
            raise PosbenchError(f"tener init_std must be >= 0 (or null), got {init_std}")
        self.u = nn.Parameter(torch.randn(dims.n_layers, dims.n_heads, dims.head_dim) * std)
        self.v = nn.Parameter(torch.randn(dims.n_layers, dims.n_heads, dims.head_dim) * std)

    def pair_cost(self) -> int:
        return 2 * self.dims.n_heads  # the (Q + v) R term by offset, then gathered

    def score(self, q, k, q_pos, k_pos, layer):
        offset = _offsets(q_pos, k_pos)  # (Tq, Tk), signed t - j
        lo, hi = distance_range(q_pos, k_pos)  # the offsets' extremes
        R = sinusoid_table(torch.arange(lo, hi + 1, device=q.device), self.dims.head_dim, self.base)  # R_{t-j}
        qv = q + self.v[layer][:, None, :].to(q.dtype)  # (B, H, Tq, hs)
        by_offset = qv @ R.T.to(q.dtype)  # (B, H, Tq, hi - lo + 1): (Q_t + v) R_{t-j}
        uk = self.u[layer][:, None, :].to(k.dtype) @ k.transpose(-2, -1)  # (B, H, 1, Tk): u K_j
        return gather_relative(by_offset, offset - lo).float() + uk.float()

    def logit_scale(self) -> float:
        return self.dims.head_dim ** -0.5 if self.scaled else 1.0
