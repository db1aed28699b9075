"""Position encodings applied to the token embeddings before the first block (``embed`` hook).

Absolute tables (sinusoidal, learned), word-dependent complex embeddings, and schemes whose
position comes from the order-sensitive layer itself (causal convolution, recurrence)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import PosbenchError
from .base import ModelDims, PositionEncoding, PositionRangeError, register
from .span import span

LAYOUTS = ("interleave", "concat")
TABLES = ("learned", "sinusoidal")


def sinusoid_table(positions: torch.Tensor, dim: int, base: float = 10000.0,
                   layout: str = "interleave") -> torch.Tensor:
    """Fixed sin/cos position table. positions: (T,) -> (T, dim).

    ``interleave`` (Vaswani et al. 2017, sec. 3.5; the default):
    PE(pos, 2i) = sin(pos / base^(2i/d)),  PE(pos, 2i+1) = cos(pos / base^(2i/d)).

    ``concat``: [sin(pos w_0) .. sin(pos w_{h-1}), cos(pos w_0) .. cos(pos w_{h-1})] with
    h = d/2 and w_i = exp(-ln(base) i / (h - 1)), so the lowest frequency is exactly 1/base.
    This is tensor2tensor's ``get_timing_signal_1d`` (log_timescale_increment = ln(base) /
    (h - 1)), fairseq's ``SinusoidalPositionalEmbedding``, DDPM's ``get_timestep_embedding``
    and Diffusion Policy's ``SinusoidalPosEmb``. Not a permutation of ``interleave``: its
    frequencies base^(-i/(h-1)) differ from base^(-2i/d) = base^(-i/h) for every 0 < i < h.
    """
    if layout not in LAYOUTS:
        raise PosbenchError(f"sinusoid layout {layout!r} is not valid; valid choices: {', '.join(LAYOUTS)}")
    if dim % 2 or (layout == "concat" and dim < 4):
        raise PosbenchError(f"sinusoid layout {layout!r} needs an even dimension"
                            f"{' of at least 4' if layout == 'concat' else ''}, got {dim}")
    half = dim // 2
    if layout == "interleave":
        inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim)
    else:
        i = torch.arange(half, dtype=torch.float32, device=positions.device)
        inv_freq = torch.exp(-math.log(base) * i / (half - 1))  # exp(-ln(base) i / (h - 1))
    angles = positions.float()[:, None] * inv_freq[None, :]  # (T, dim/2)
    if layout == "concat":
        return torch.cat((angles.sin(), angles.cos()), dim=-1)  # [sin..., cos...]
    table = torch.stack((angles.sin(), angles.cos()), dim=-1)  # (T, dim/2, 2)
    return table.flatten(1)  # interleaved: sin at even, cos at odd dims


@register
class Sinusoidal(PositionEncoding):
    """Fixed sinusoids added to the token embeddings; ``layout`` picks the table
    (:func:`sinusoid_table`): ``interleave`` as in the paper, or ``concat`` as in
    tensor2tensor, fairseq and the diffusion/robotics code that copied them.

    Vaswani et al. (sec. 3.4) multiply the token embeddings by sqrt(d_model) before adding the
    table, as posbench's default ``model.embed_scale=sqrt_d`` does for every encoding."""

    name = "sinusoidal"
    paper = "Vaswani et al. 2017, Attention Is All You Need"
    description = "fixed sin/cos absolute positions added to the token embeddings"
    scale_token_embedding = True

    def __init__(self, dims: ModelDims, base: float = 10000.0, layout: str = "interleave"):
        super().__init__(dims)
        self.base = float(base)
        self.layout = str(layout)
        sinusoid_table(torch.zeros(1), dims.d_model, self.base, self.layout)  # fail at build time

    def embed(self, x, positions, tokens):
        return x + sinusoid_table(positions, self.dims.d_model, self.base, self.layout).to(x.dtype)


def lookup_learned(table: nn.Embedding, positions: torch.Tensor) -> torch.Tensor:
    """Rows of a learned position table, (T,) -> (T, D); a PositionRangeError past its end."""
    last = span(positions)[1]  # the largest (positions increase)
    if last >= table.num_embeddings:
        raise PositionRangeError(
            f"learned position table has {table.num_embeddings} entries, cannot encode position "
            f"{last} (learned absolute positions do not extrapolate)")
    return table(positions)


@register
class Learned(PositionEncoding):
    """A trainable table of ``max_len`` absolute positions added to the token embeddings
    (Gehring et al. 2017; Radford et al. 2018, GPT). Init N(0, 0.02), as karpathy/nanoGPT
    ``model.py`` (``wpe``) and Hugging Face ``GPT2Model`` (``initializer_range`` 0.02) do.
    Past ``max_len`` it fails loudly (:func:`lookup_learned`).

    GPT adds it to unscaled token embeddings (``model.embed_scale=none``); fairseq's learned
    positions, like its sinusoids, follow token embeddings times sqrt(d_model) (``sqrt_d``,
    the default)."""

    name = "learned"
    paper = "Gehring et al. 2017; Radford et al. 2018 (GPT)"
    description = "trainable absolute position table; cannot go past its length"
    scale_token_embedding = True

    def __init__(self, dims: ModelDims, max_len: int | None = None):
        super().__init__(dims)
        self.max_len = int(max_len or dims.train_len)
        self.table = nn.Embedding(self.max_len, dims.d_model)
        nn.init.normal_(self.table.weight, std=0.02)

    def embed(self, x, positions, tokens):
        return x + lookup_learned(self.table, positions).to(x.dtype)

    def from_parent(self, name: str, value: torch.Tensor) -> torch.Tensor | None:
        """A parent's shorter table stretched over this one's positions, as Position Interpolation
        does for positions (Chen et al. 2023, sec. 2.3: position p of the longer window is read at
        p / s, s = new rows / old rows), linearly between the two rows around p / s (the last row
        past it): the extension of a learned table by fine-tuning."""
        rows = self.table.num_embeddings
        if name != "table.weight" or value.dim() != 2 or value.shape[1] != self.dims.d_model or not \
                value.shape[0] < rows:
            return None
        return interpolate_rows(value, rows)


def interpolate_rows(table: torch.Tensor, rows: int) -> torch.Tensor:
    """(n, D) -> (rows, D): row p is ``table`` at p n / rows, linear between its neighbours."""
    n = table.shape[0]
    x = torch.arange(rows, dtype=torch.float64) * n / rows
    lo = x.floor().long().clamp(max=n - 1)
    hi = (lo + 1).clamp(max=n - 1)
    w = (x - lo).to(table.dtype)[:, None]
    return table[lo] * (1 - w) + table[hi] * w


@register
class Multiplicative(PositionEncoding):
    """Absolute positions combined with the tokens by an element-wise product,

        x'_pos = x_pos * p_pos,

    instead of the sum x_pos + p_pos of Vaswani et al.: a position-dependent gain on every
    channel. The product form appears as "multiplicative binding" of token and position
    vectors in hyperdimensional-computing encoders, and Wang et al. 2020's complex embeddings
    (``complex``) are a word amplitude times a position phasor, r_w * exp(i(omega pos + theta)).
    Here the position vector is word-independent, as in the additive schemes it is compared with.

    ``table: sinusoidal`` (default): p is the fixed sinusoid table of ``layout`` (see
    :func:`sinusoid_table`), values in [-1, 1]. ``table: learned``: p is a trainable
    (max_len, d_model) table initialised to ones, so the model starts as NoPE and learns
    position-dependent gains; like ``learned`` it cannot encode positions past ``max_len``.

    A product has no sum to balance: sqrt(d_model) (``model.embed_scale=sqrt_d``) only rescales
    x * p; runs made before that setting used ``none`` for this encoding.
    """

    name = "multiplicative"
    paper = "product counterpart of Vaswani et al. 2017's sum (multiplicative binding)"
    description = "token embeddings times a sinusoidal or learned absolute position table, x * p_pos"
    scale_token_embedding = False

    def __init__(self, dims: ModelDims, table: str = "sinusoidal", max_len: int | None = None,
                 base: float = 10000.0, layout: str = "interleave"):
        super().__init__(dims)
        if table not in TABLES:
            raise PosbenchError(f"multiplicative table {table!r} is not valid; valid choices: {', '.join(TABLES)}")
        self.kind, self.base, self.layout = str(table), float(base), str(layout)
        self.max_len = int(max_len or dims.train_len)
        if self.kind == "learned":
            self.table = nn.Embedding(self.max_len, dims.d_model)
            nn.init.ones_(self.table.weight)
        else:
            sinusoid_table(torch.zeros(1), dims.d_model, self.base, self.layout)  # fail at build time

    def positions_table(self, positions: torch.Tensor) -> torch.Tensor:
        """p_pos for ``positions``: (T,) -> (T, D)."""
        if self.kind == "sinusoidal":
            return sinusoid_table(positions, self.dims.d_model, self.base, self.layout)
        return lookup_learned(self.table, positions)

    def embed(self, x, positions, tokens):
        return x * self.positions_table(positions).to(x.dtype)  # (B, T, D) * (T, D)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, table={self.kind}"


@register
class Complex(PositionEncoding):
    """Word-order-aware complex word embeddings (Wang et al. 2020, "Encoding word order in
    complex embeddings", ICLR), the solution of their Claim 1 written per dimension: word w
    at position pos is

        f(w, pos)_k = r_{w,k} exp(i (omega_{w,k} pos + theta_{w,k})),   k = 1 .. D/2,

    with amplitude r, frequency omega and initial phase theta looked up per vocabulary entry.
    A shift by delta multiplies every dimension by exp(i omega delta): a rotation that depends
    only on the offset, while |f| = |r| does not depend on position at all.

    The real-valued model receives [Re f, Im f] (D/2 + D/2 = D). As in the paper this
    *replaces* the word embedding: ``x`` is ignored and the model's ``tok_emb`` serves only
    as the (untied in effect) output embedding, so ``model.embed_scale`` does not reach the
    input of this encoding at all; r, omega and theta are an extra (V, 3D/2) input table.

    Initialisation: r ~ N(0, 0.02) like the model's token embedding; omega_{w,k} =
    base^(-2k/D) for every word, the sinusoidal frequencies (the authors' language-model
    code likewise starts its per-word frequencies from the sinusoidal ones), so at step 0
    positions are encoded at wavelengths from 2 pi to about 2 pi base; theta ~ U(0, 2 pi).
    """

    name = "complex"
    paper = "Wang et al. 2020, Encoding word order in complex embeddings (ICLR)"
    description = "per-word amplitude, frequency and phase r exp(i(omega pos + theta)); replaces the token embedding"
    scale_token_embedding = False

    def __init__(self, dims: ModelDims, base: float = 10000.0):
        super().__init__(dims)
        if dims.d_model % 2:
            raise PosbenchError(f"complex embeddings need an even d_model (real and imaginary halves), "
                                f"got {dims.d_model}")
        half, vocab = dims.d_model // 2, dims.vocab_size
        self.amplitude = nn.Embedding(vocab, half)  # r: (V, D/2)
        self.frequency = nn.Embedding(vocab, half)  # omega: (V, D/2)
        self.phase = nn.Embedding(vocab, half)  # theta: (V, D/2)
        nn.init.normal_(self.amplitude.weight, std=0.02)
        inv_freq = float(base) ** (-torch.arange(0, dims.d_model, 2, dtype=torch.float32) / dims.d_model)
        with torch.no_grad():
            self.frequency.weight.copy_(inv_freq.expand(vocab, half))
        nn.init.uniform_(self.phase.weight, 0.0, 2 * math.pi)

    def embed(self, x, positions, tokens):
        if self.dims.vocab_size <= 0:
            raise PosbenchError("complex embeddings are word-dependent: build them with ModelDims.vocab_size > 0")
        r, omega, theta = self.amplitude(tokens), self.frequency(tokens), self.phase(tokens)  # (B, T, D/2)
        angle = omega * positions.to(omega.dtype)[None, :, None] + theta  # omega pos + theta
        return torch.cat((r * angle.cos(), r * angle.sin()), dim=-1).to(x.dtype)  # (B, T, D)


@register
class Conv(PositionEncoding):
    """Position from a causal depthwise convolution over the token embeddings.

    y_t = x_t + b + sum_{j=0}^{k-1} w_j * x_{t-j},   x_{t<0} = 0   (per channel, * element-wise)

    This is the positional encoding generator (PEG) of Chu et al. 2023, "Conditional
    Positional Encodings for Vision Transformers" (ICLR): a depthwise convolution
    with zero padding whose output is added to its input, made causal for a decoder by padding
    on the left only. The kernel sees relative order inside its window; absolute position
    reaches the model only through the zero padding at the start of the sequence (Islam et
    al. 2020, "How much position information do CNNs encode?", ICLR): past the first k-1
    positions, the same k tokens are encoded the same way wherever they sit.

    The residual form keeps the token embedding on the direct path; the convolution is linear
    in x, so there is no table to balance against. The PEG sits in a vision transformer whose
    patch embeddings are not scaled; runs made before ``model.embed_scale`` used ``none``.
    Weights use PyTorch's default Conv1d initialisation, the bias starts at zero.
    """

    name = "conv"
    paper = "Chu et al. 2023, Conditional Positional Encodings (PEG), made causal"
    description = "x + causal depthwise conv1d(x) with left zero padding before the first block"
    scale_token_embedding = False
    reads_positions = False  # position comes from the zero padding, not from position values

    def __init__(self, dims: ModelDims, kernel_size: int = 3):
        super().__init__(dims)
        if int(kernel_size) < 1:
            raise PosbenchError(f"conv kernel_size must be >= 1, got {kernel_size}")
        self.kernel_size = int(kernel_size)
        self.conv = nn.Conv1d(dims.d_model, dims.d_model, self.kernel_size, groups=dims.d_model)
        nn.init.zeros_(self.conv.bias)

    def embed(self, x, positions, tokens):
        padded = F.pad(x.transpose(1, 2), (self.kernel_size - 1, 0))  # (B, D, k-1+T), zeros on the left only
        return (x + self.conv(padded).transpose(1, 2)).to(x.dtype)  # (B, T, D)


@register
class Recurrent(PositionEncoding):
    """Position from a causal GRU run over the token embeddings before the first block.

    Neishi & Yoshinaga 2019, "On the Relation between Position Information and Sentence
    Length in Neural Machine Translation" (CoNLL): RNN-Transformer, an RNN in place
    of the positional-encoding layer. The recurrence is the GRU of Cho et al. 2014 (eqs. 5-8)
    in PyTorch/cuDNN form:

        r_t = sigmoid(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)
        z_t = sigmoid(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)
        n_t = tanh(W_in x_t + b_in + r_t * (W_hn h_{t-1} + b_hn))
        h_t = (1 - z_t) * n_t + z_t * h_{t-1},   h_{-1} = 0

    With ``residual`` (the default) the output is x_t + h_t: the token embedding reaches the
    first block unchanged and the GRU adds order information, which matters here because the
    output embedding is tied to the input one. ``residual: false`` feeds h_t alone, as in the
    paper. The GRU always runs in float32 with autocast off, so the hidden state carried over
    thousands of steps is not rounded to bf16 at every step; the layer is small. Runs made
    before ``model.embed_scale`` used ``none`` for this encoding.
    """

    name = "rnn"
    paper = "Neishi & Yoshinaga 2019, RNN-Transformer (CoNLL); GRU of Cho et al. 2014"
    description = "causal GRU over the token embeddings, added to them (or replacing them)"
    scale_token_embedding = False
    reads_positions = False  # position comes from the recurrence, not from position values

    def __init__(self, dims: ModelDims, residual: bool = True):
        super().__init__(dims)
        self.residual = bool(residual)
        self.gru = nn.GRU(dims.d_model, dims.d_model, batch_first=True)

    def embed(self, x, positions, tokens):
        with torch.autocast(x.device.type, enabled=False):
            h, _ = self.gru(x.float())  # (B, T, D), h_t sees x_0 .. x_t only
        return (x + h if self.residual else h).to(x.dtype)
