"""Static additive attention biases (``bias`` hook): b(h, i, j) depends on positions only."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import PosbenchError
from .base import ModelDims, PositionEncoding, register
from .span import distance_range


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Press et al. 2022, sec. 3: geometric slopes starting at 2^(-8/n) with ratio 2^(-8/n).
    For n not a power of two, take the slopes of the closest smaller power of two, then
    every other slope of twice that many heads (the paper's interleaving rule)."""
    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = power_of_two(closest)
    if closest < n_heads:
        slopes += power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


ALIBI_FORMS = ("causal", "symmetric")


@register
class ALiBi(PositionEncoding):
    """Press et al. 2022: b(h, i, j) = -m_h (i - j), m the geometric slopes of :func:`alibi_slopes`.

    ``form``: ``causal`` (default) is the paper's decoder bias -m (i - j). ``symmetric`` is
    -m |i - j|, the form of encoder ports such as MosaicBERT (mosaicml/examples ``bert_layers``)
    and Composer's ALiBi surgery, suggested by Press for bidirectional models. The two differ only
    where j > i, which a causal mask removes: in this decoder they give the same outputs.

    ``learned_slopes``: the slopes become trainable, parameterised by their logarithm and
    initialised at the paper's values, as x-transformers' ``LearnedAlibiPositionalBias``
    (lucidrains/x-transformers ``x_transformers/x_transformers.py``: ``learned_logslopes =
    log(slopes)``, bias = -|i - j| * exp(learned_logslopes)), so slopes stay positive with no
    clamp. That is the reference parameterisation and this follows it unchanged (no scale on the
    bias). Shared by all layers either way.
    """

    relative_bias = True  # a function of i - j
    layer_invariant_bias = True  # one bias for all layers

    name = "alibi"
    paper = "Press et al. 2022, Train Short, Test Long (ALiBi)"
    description = "linear distance penalty -m_h (i - j), fixed geometric slopes per head"

    def __init__(self, dims: ModelDims, form: str = "causal", learned_slopes: bool = False):
        super().__init__(dims)
        if form not in ALIBI_FORMS:
            raise PosbenchError(f"alibi form {form!r} is not valid; valid choices: {', '.join(ALIBI_FORMS)}")
        self.form, self.learned_slopes = str(form), bool(learned_slopes)
        if self.learned_slopes:
            self.log_slopes = nn.Parameter(alibi_slopes(dims.n_heads).log())  # m = exp(log m) > 0
        else:
            self.register_buffer("fixed_slopes", alibi_slopes(dims.n_heads), persistent=False)

    @property
    def slopes(self) -> torch.Tensor:
        """m_h, (H,)."""
        return self.log_slopes.exp() if self.learned_slopes else self.fixed_slopes

    def bias(self, q_pos, k_pos, layer):
        distance = (q_pos[:, None] - k_pos[None, :]).float()  # (Tq, Tk), i - j
        if self.form == "symmetric":
            distance = distance.abs()  # |i - j|
        return -self.slopes[:, None, None] * distance  # (H, Tq, Tk)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, form={self.form}, learned_slopes={self.learned_slopes}"


def t5_bucket(distance: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Raffel et al. 2020 (T5), unidirectional buckets of n = max(i - j, 0): exact below
    num_buckets/2, then log-spaced up to max_distance, beyond which all share the last."""
    n = distance.clamp(min=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    scaled = torch.log(n.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (scaled * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return torch.where(is_small, n, large)


T5_BIAS_SCALES = ("sqrt_head_dim", "none")


@register
class T5Bias(PositionEncoding):
    """Raffel et al. 2020 ("Exploring the Limits of Transfer Learning with a Unified Text-to-Text
    Transformer", JMLR, sec. 2.1): a learned scalar per head and distance bucket
    (:func:`t5_bucket`), added to the attention logits.

    ``bias_scale``: how the table reaches the logits, and with it the default init.

    - ``sqrt_head_dim`` (default): the form of the length-extrapolation baselines,
      lucidrains/x-transformers ``x_transformers/x_transformers.py`` ``RelativePositionBias``:
      b = sqrt(head_dim) * table[bucket], the table an ``nn.Embedding`` left at PyTorch's default
      init N(0, 1) (``Attention`` builds it with ``scale = dim_head ** 0.5`` and nothing
      re-initialises it), added to the already scaled logits q.k / sqrt(head_dim). The KERPLE
      authors' GPT-NeoX baseline (chijames/KERPLE ``megatron/mpu/layers.py``
      ``ParallelRelativePositionBias``, "based on" x-transformers) uses the same scale with a
      Xavier-normal table. With the scale, an optimiser step of size lr moves the bias by
      sqrt(head_dim) * lr, so the table can learn within a short schedule.
    - ``none``: b = table[bucket], unscaled, init N(0, 0.02) (GPT-2's init, as every other
      weight here): the Mesh TensorFlow / Hugging Face ``T5Attention`` form (Hugging Face
      initialises its table at N(0, d_model^-0.5) and folds 1/sqrt(d) into the query init instead
      of scaling q.k). With AdamW at lr 1e-3 over a few hundred steps no entry can move further
      than the summed learning rate, a fraction of a logit.

    ``init_std``: the table's init N(0, init_std); null takes the form's own (1.0 with
    ``sqrt_head_dim``, 0.02 with ``none``).

    ``per_layer: false`` (default): one table shared by all layers, as in T5 (Mesh TensorFlow
    and Hugging Face compute it in the first layer and hand it on) and x-transformers (one
    ``rel_pos`` module for all layers). ``per_layer: true``: one table per layer, each scaled
    and initialised as above, as BEiT's ``use_rel_pos_bias`` (against its
    ``use_shared_rel_pos_bias``) and Swin's per-block tables; the instance then sets
    ``layer_invariant_bias = False`` so the attention kernel rebuilds the bias in every layer.
    """

    relative_bias = True  # a function of i - j
    layer_invariant_bias = True  # one table for all layers, unless per_layer (set per instance)
    former_defaults = {"bias_scale": "none", "init_std": 0.02}  # runs saved before bias_scale existed

    name = "t5"
    paper = "Raffel et al. 2020, T5 relative position bias"
    description = "learned scalar per head for log-spaced distance buckets, shared by layers (or per layer)"

    def __init__(self, dims: ModelDims, num_buckets: int = 32, max_distance: int = 128,
                 per_layer: bool = False, bias_scale: str = "sqrt_head_dim", init_std: float | None = None):
        super().__init__(dims)
        self.num_buckets, self.max_distance = int(num_buckets), int(max_distance)
        self.per_layer = bool(per_layer)
        if self.num_buckets < 2 or self.max_distance <= self.num_buckets // 2:
            raise PosbenchError(f"t5 needs num_buckets >= 2 and max_distance > num_buckets / 2, got "
                                f"num_buckets={num_buckets}, max_distance={max_distance}")
        if bias_scale not in T5_BIAS_SCALES:
            raise PosbenchError(f"t5 bias_scale {bias_scale!r} is not valid; "
                                f"valid choices: {', '.join(T5_BIAS_SCALES)}")
        self.bias_scale = str(bias_scale)
        self.scale = dims.head_dim ** 0.5 if self.bias_scale == "sqrt_head_dim" else 1.0
        self.init_std = None if init_std is None else float(init_std)
        std = (1.0 if self.bias_scale == "sqrt_head_dim" else 0.02) if init_std is None else float(init_std)
        if std < 0:
            raise PosbenchError(f"t5 init_std must be >= 0 (or null), got {init_std}")
        if self.per_layer:
            self.layer_invariant_bias = False
            self.tables = nn.ModuleList(nn.Embedding(self.num_buckets, dims.n_heads) for _ in range(dims.n_layers))
            for table in self.tables:
                nn.init.normal_(table.weight, std=std)
        else:
            self.table = nn.Embedding(self.num_buckets, dims.n_heads)
            nn.init.normal_(self.table.weight, std=std)

    def bias(self, q_pos, k_pos, layer):
        buckets = t5_bucket(q_pos[:, None] - k_pos[None, :], self.num_buckets, self.max_distance)
        table = self.tables[layer] if self.per_layer else self.table
        return table(buckets).permute(2, 0, 1) * self.scale  # (Tq, Tk, H) -> (H, Tq, Tk)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, per_layer={self.per_layer}, bias_scale={self.bias_scale}"


# ---- helpers shared by the learned and parameter-free distance biases ------------------------

def causal_distance(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """(Tq,), (Tk,) -> (Tq, Tk) distances i - j, with future pairs (j > i) set to 0. Every
    kernel masks those pairs; clamping keeps log, pow and the MLPs finite (and their gradients
    defined) there, as KERPLE's ``tril`` of the distance matrix does."""
    return (q_pos[:, None] - k_pos[None, :]).clamp(min=0)


def by_distance(table_fn, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Evaluate a function of the distance once per distance 0 .. N-1, then gather.

    ``table_fn``: (N,) float distances -> (H, N). Returns (H, Tq, Tk). The table covers every
    causal distance, max(q_pos) - min(k_pos) at most: N = Tk when the positions are consecutive
    (a query chunk [s, e) sees keys [0, e), so distances lie in 0 .. Tk-1), more when they have
    gaps (randomized positions, :mod:`posbench.encodings.randomized`).
    """
    n = max(k_pos.shape[0], distance_range(q_pos, k_pos)[1] + 1)
    distances = torch.arange(n, device=k_pos.device, dtype=torch.float32)
    with torch.autocast(k_pos.device.type, enabled=False):  # tables in fp32 under bf16 autocast
        table = table_fn(distances)  # (H, N)
    return table[:, causal_distance(q_pos, k_pos)]


# ---- KERPLE (Chi et al. 2022) ------------------------------------------------------------

KERPLE_EPS = 1e-2  # floor on r1, r2 in the authors' code


class _Kerple(PositionEncoding):
    """Two learned per-head parameters (r1, r2), shared by all layers as in the authors'
    GPT-NeoX code (one module handed to every layer).

    Reference: chijames/KERPLE ``megatron/mpu/layers.py`` (``ParallelKerpleLog``,
    ``ParallelKerplePower``), built once in ``megatron/model/gpt2_model.py``. This follows it
    unchanged: the bias is added to the scaled logits with no extra scale, the uniform inits
    below, and the clamp.

    Positivity: the authors' projection. Before each use the stored values are clamped in
    place (``.data``, outside autograd) to r >= 1e-2, and for the power exponent also r2 <= 2.
    A parameter that an optimiser step pushed out of range is reset to the boundary on the next
    forward pass, and its gradient there is the ordinary one (no zero-gradient clamp, no
    softplus reparameterisation changing the optimisation dynamics).
    """

    relative_bias = True  # a function of i - j
    layer_invariant_bias = True  # one bias for all layers

    r2_max: float = float("inf")

    def __init__(self, dims: ModelDims, r1_init_scale: float, r2_init_scale: float):
        super().__init__(dims)
        # authors' init: uniform on (0, scale) per head
        self.r1 = nn.Parameter(r1_init_scale * torch.rand(dims.n_heads))
        self.r2 = nn.Parameter(r2_init_scale * torch.rand(dims.n_heads))
        self.project()

    def project(self) -> None:
        """Clamp r1 >= eps and eps <= r2 <= r2_max in place; a no-op once they are in range.
        Through ``.data`` so autograd's version counter is untouched: layers that used r1, r2
        earlier in this forward pass keep valid saved tensors."""
        self.r1.data.clamp_(min=KERPLE_EPS)
        self.r2.data.clamp_(min=KERPLE_EPS, max=self.r2_max)

    def bias(self, q_pos, k_pos, layer):
        self.project()
        distance = causal_distance(q_pos, k_pos).float()  # (Tq, Tk), |i - j| for j <= i
        return self.kernel(self.r1[:, None, None], self.r2[:, None, None], distance)  # (H, Tq, Tk)


@register
class KerpleLog(_Kerple):
    """KERPLE, logarithmic variant (Chi, Fan, Ramadge and Rudnicky 2022, "KERPLE: Kernelized
    Relative Positional Embedding for Length Extrapolation", NeurIPS; the paper's "log" CPD
    kernel, the variant it recommends):

        b(h, i, j) = -r1_h log(1 + r2_h |i - j|),    r1_h, r2_h > 0 learned per head.

    Init as in the authors' code: r1 ~ U(0, 2), r2 ~ U(0, 1). Positivity: see ``_Kerple``.
    """

    name = "kerple_log"
    paper = "Chi et al. 2022, KERPLE (logarithmic variant)"
    description = "learned per-head -r1 log(1 + r2 |i - j|), shared by layers"

    def __init__(self, dims: ModelDims):
        super().__init__(dims, r1_init_scale=2.0, r2_init_scale=1.0)

    @staticmethod
    def kernel(r1, r2, distance):
        return -r1 * torch.log1p(r2 * distance)


@register
class KerplePower(_Kerple):
    """KERPLE, power variant (Chi et al. 2022, KERPLE, NeurIPS; the paper's "power" CPD kernel,
    which is conditionally positive definite only for exponents in (0, 2]):

        b(h, i, j) = -r1_h |i - j|^r2_h,    r1_h > 0, 0 < r2_h <= 2 learned per head.

    Init as in the authors' code: r1 ~ U(0, 1), r2 ~ U(0, 2). Range: see ``_Kerple``.
    """

    name = "kerple_power"
    paper = "Chi et al. 2022, KERPLE (power variant)"
    description = "learned per-head -r1 |i - j|^r2 with 0 < r2 <= 2, shared by layers"
    r2_max = 2.0

    def __init__(self, dims: ModelDims):
        super().__init__(dims, r1_init_scale=1.0, r2_init_scale=2.0)

    @staticmethod
    def kernel(r1, r2, distance):
        return -r1 * distance.pow(r2)


# ---- Sandwich (Chi et al. 2023) ----------------------------------------------------------

@register
class Sandwich(PositionEncoding):
    """Sandwich (Chi, Fan, Rudnicky and Ramadge 2023, "Dissecting Transformer Length
    Extrapolation via the Lens of Receptive Field Analysis", ACL): the inner product of
    two d'-dimensional sinusoidal position embeddings, shifted so it is 0 at distance 0,

        p_i . p_j - d'/2 = sum_{k=1}^{d'/2} cos((i - j) / 10000^(2k/d')) - d'/2,

    then compressed per head like ALiBi's slopes: head n = 1 .. H is divided by 8n/H (the
    paper's h = n * 8/H; NeMo's port does the same). Parameter-free; shared by layers.

    ``dim`` is d', a width of its own, independent of d_model: NeMo's port takes the head size;
    we default to 128. The bias is a function of the distance only, so it is evaluated once per
    distance (:func:`by_distance`: Tk * d'/2 cosines at consecutive positions) and gathered, never
    as a (Tq, Tk, d'/2) tensor.
    """

    relative_bias = True  # a function of i - j
    layer_invariant_bias = True  # one bias for all layers

    name = "sandwich"
    paper = "Chi et al. 2023, Dissecting Transformer Length Extrapolation (Sandwich)"
    description = "sinusoid inner product sum_k cos((i-j) w_k) - d'/2, compressed by 8n/H per head"

    def __init__(self, dims: ModelDims, dim: int = 128):
        super().__init__(dims)
        if int(dim) < 2 or int(dim) % 2:
            raise PosbenchError(f"sandwich: dim (d') must be a positive even number, got {dim}")
        self.dim = int(dim)
        k = torch.arange(1, self.dim // 2 + 1, dtype=torch.float32)
        self.register_buffer("inv_freq", 10000.0 ** (-2.0 * k / self.dim), persistent=False)  # (d'/2,)
        n = torch.arange(1, dims.n_heads + 1, dtype=torch.float32)
        self.register_buffer("compression", 8.0 * n / dims.n_heads, persistent=False)  # (H,)

    def table(self, distances: torch.Tensor) -> torch.Tensor:
        """(N,) distances -> (H, N) compressed p_i . p_j - d'/2."""
        dot = torch.cos(distances[:, None] * self.inv_freq[None, :]).sum(-1) - self.dim / 2  # (N,)
        return dot[None, :] / self.compression[:, None]

    def bias(self, q_pos, k_pos, layer):
        return by_distance(self.table, q_pos, k_pos)


# ---- FIRE (Li et al. 2024) ---------------------------------------------------------------

FIRE_EPS = 1e-6  # added to the normaliser, as in the paper's reference code


@register
class FIRE(PositionEncoding):
    """FIRE, Functional Interpolation for Relative Positions (Li et al. 2024, "Functional
    Interpolation for Relative Positions Improves Long Context Transformers", ICLR):

        b(h, i, j) = f_h( psi(i - j) / psi(max(L, i)) ),    psi(x) = log(c x + 1),

    f an MLP 1 -> ``mlp_width`` (ReLU) -> H. The input lies in [0, 1] whatever the length
    ("progressive interpolation"); the threshold L keeps short contexts from being stretched.

    c and L are learned: as in the paper's appendix code, psi uses |c x| and L = |s| * L0 with
    a learned multiplier s (init 1) on L0 = ``init_threshold`` (default train_len), so both stay
    positive and L moves at a rate relative to its size. Init c = ``init_c`` = 0.1.

    Reference: the PyTorch ``FIRE`` module of the paper's appendix (its only published code):
    ``init_c=0.1``, ``L_multiplier`` init 1 on a fixed ``init_L``, eps 1e-6 on the normaliser,
    ``nn.Linear`` layers at PyTorch's default init, the MLP output added to the logits
    unscaled. This follows it unchanged, except L0: the appendix code's default ``init_L`` is
    512, its pretraining length; here L0 defaults to the training length likewise.

    One MLP (and c, L) shared by all layers, like T5 and KERPLE here. The input depends on i
    as well as on i - j, so f runs per (i, j) pair: (Tq, Tk, mlp_width) activations per query
    chunk. It runs in fp32 even under bf16 autocast: bf16 cannot tell apart the inputs of
    neighbouring keys at long range (their difference is ~1e-4 near 1).
    """

    layer_invariant_bias = True  # one MLP for all layers

    name = "fire"
    paper = "Li et al. 2024, Functional Interpolation for Relative Positions (FIRE)"
    description = "MLP of log-distance normalised by log(max(L, i)); c, L learned; shared"

    def __init__(self, dims: ModelDims, mlp_width: int = 32, init_c: float = 0.1,
                 init_threshold: float | None = None):
        super().__init__(dims)
        self.mlp = nn.Sequential(nn.Linear(1, int(mlp_width)), nn.ReLU(),
                                 nn.Linear(int(mlp_width), dims.n_heads))
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.init_threshold = float(init_threshold or dims.train_len)  # L0
        self.threshold_scale = nn.Parameter(torch.tensor(1.0))  # s, L = |s| L0

    def pair_cost(self) -> int:
        return 2 * self.mlp[0].out_features + self.dims.n_heads  # MLP input, hidden, ReLU, output

    def psi(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log1p(torch.abs(self.c * x))

    def threshold(self) -> torch.Tensor:
        return torch.abs(self.threshold_scale * self.init_threshold)

    def bias(self, q_pos, k_pos, layer):
        with torch.autocast(q_pos.device.type, enabled=False):
            query = q_pos.float()
            normaliser = self.psi(torch.maximum(query, self.threshold())) + FIRE_EPS  # (Tq,)
            distance = causal_distance(q_pos, k_pos).float()  # (Tq, Tk)
            x = self.psi(distance) / normaliser[:, None]  # (Tq, Tk), in [0, 1]
            return self.mlp(x[..., None]).permute(2, 0, 1)  # (Tq, Tk, H) -> (H, Tq, Tk)


# ---- dynamic position bias (Wang et al. 2022; x-transformers) ----------------------------

@register
class DynamicPositionBias(PositionEncoding):
    """Dynamic position bias: an MLP maps the log-distance to one bias per head (Wang et al.
    2022, "CrossFormer: A Versatile Vision Transformer Hinging on Cross-scale Attention", ICLR,
    there over 2-D offsets; here in 1-D with log distance, as x-transformers'
    ``DynamicPositionBias(log_distance=True)``):

        b(h, i, j) = MLP(sign(i - j) log(1 + |i - j|))_h.

    MLP as in x-transformers (lucidrains/x-transformers ``x_transformers/x_transformers.py``
    ``DynamicPositionBias``): 1 -> width (SiLU) -> [width -> width (SiLU)] * (depth - 1) -> H,
    width = d_model // 4 unless given, depth 2, no normalisation, ``nn.Linear`` layers at
    PyTorch's default init, output added to the logits unscaled; one MLP shared by all layers
    (x-transformers builds one ``rel_pos`` for all layers). This follows it unchanged.

    ``log_distance``: true (default) feeds sign(d) log(1 + |d|), x-transformers'
    ``dynamic_pos_bias_log_distance=True``, the log-spaced coordinates of Swin Transformer V2
    (Liu et al. 2022, eq. 4), which keep the MLP's input small at 16x the training length;
    false feeds the raw distance d, x-transformers' default and CrossFormer's linear offsets.
    The bias depends on i - j only, so the MLP runs once per distance (:func:`by_distance`;
    causal distances are >= 0, where sign(d) log(1 + |d|) = log(1 + d)), then is gathered.
    """

    relative_bias = True  # a function of i - j
    layer_invariant_bias = True  # one bias for all layers

    name = "dynamic"
    paper = "Wang et al. 2022, CrossFormer (dynamic position bias); x-transformers"
    description = "MLP of log(1 + |i - j|) giving a bias per head, evaluated once per distance"

    def __init__(self, dims: ModelDims, width: int | None = None, depth: int = 2, log_distance: bool = True):
        super().__init__(dims)
        width = int(width or dims.d_model // 4)
        if int(depth) < 1:
            raise PosbenchError(f"dynamic: depth must be at least 1, got {depth}")
        layers: list[nn.Module] = [nn.Linear(1, width), nn.SiLU()]
        for _ in range(int(depth) - 1):
            layers += [nn.Linear(width, width), nn.SiLU()]
        layers.append(nn.Linear(width, dims.n_heads))
        self.mlp = nn.Sequential(*layers)
        self.log_distance = bool(log_distance)

    def table(self, distances: torch.Tensor) -> torch.Tensor:
        """(N,) distances >= 0 -> (H, N)."""
        x = torch.log1p(distances) if self.log_distance else distances  # log(1 + d), or d
        return self.mlp(x[:, None]).t()

    def bias(self, q_pos, k_pos, layer):
        return by_distance(self.table, q_pos, k_pos)
