"""A small decoder-only language model whose attention asks an encoding for its hooks.

Pre-LN blocks, GELU MLP, tied input/output embeddings, causal attention (nanoGPT-like).
Positions enter only through the encoding (see ``posbench.encodings.base``): 0 .. T-1, or the
sorted positions a caller passes (randomized positions, :mod:`posbench.encodings.randomized`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..encodings import ModelDims, PositionEncoding
from ..encodings.randomized import check_positions
from ..encodings.span import note_span, span
from ..errors import PosbenchError
from .attention import causal_attention, cumulative_decay, layer_window, refuse_sinks, token_transforms
from .length_scaling import LengthScaling, key_counts
from .loss import linear_cross_entropy
from .recurrent import MIXERS

# parameters that initialise themselves and get no weight decay: the encoding's and SSMax's scales
OWN_PARAMETERS = ("encoding.", "length_scaling.")
# parameters of model.layers' layers that keep their reference init: Mamba-2's convolution (PyTorch's
# default, as mamba_ssm's and transformers' Mamba2) and both layers' dt bias (a bias that is not zero)
MIXER_OWN = ("dt_bias", "mixer.conv.conv.weight", "mixer.conv.conv.bias")
# the attention's parameters that model options add (model.gate, model.differential, model.sinks)
OPTION_MODULES = frozenset({"gate", "diff", "subln", "sinks"})
# hooks differential attention cannot take: they change the values or the softmax its two maps share
DIFF_REFUSES = frozenset({"value", "features", "transition", "normalize"})


class Attention(nn.Module):
    """Causal self-attention. ``model.qk_norm``: RMSNorm over each head's q and k, one learned gain
    of head_dim shared by the heads, before the encoding's ``rotate`` (QK-norm: Henry et al. 2020,
    Dehghani et al. 2023; in this form OLMo 2's and Qwen3's ``q_norm``/``k_norm``); it bounds the
    logits' size, so attention cannot sharpen by growing q and k. ``model.window``: sliding-window
    attention (Beltagy et al. 2020, Longformer; Mistral 7B), each query seeing its last ``window``
    keys, itself included; an encoding may put a window on some layers (``attention_window``).
    ``model.gate``: gated attention (Qiu et al. 2025, "Gated Attention for Large Language Models",
    the paper's best placement, G1): each head's attention output, before the output projection,
    times sigmoid(x W_g), x the layer's (normed) input, the gate elementwise over the head's dims
    (``elementwise``, d_model x d_model weights: the paper's best form) or one scalar per head
    (``headwise``, d_model x n_heads); no bias, W_g at the model's N(0, 0.02) init. Qwen3-Next
    computes the same gate from a q projection twice as wide (transformers' ``Qwen3NextAttention``:
    ``query, gate = chunk(q_proj(x), 2)``, ``out * sigmoid(gate)``); a separate linear is the
    same map. The gate sees only the token's own input, so it composes with every encoding and
    kernel and keeps the model causal.

    ``model.differential``: differential attention (Ye et al. 2025, "Differential Transformer",
    ICLR; reference code microsoft/unilm ``Diff-Transformer/multihead_diffattn.py``). Each of the
    ``n_heads`` heads splits its q and k into two halves, two sub-heads of head_dim / 2 that the
    encoding sees as heads of their own (it is built for 2 x n_heads heads: ``LanguageModel.dims``),
    both attending over the head's whole value; the head's output is A1 v - lambda A2 v, lambda =
    exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init (four learned vectors of head_dim / 2 per layer,
    N(0, 0.1), shared by the heads), then RMSNorm over the head's dims (eps 1e-5, learned gain) times
    1 - lambda_init, lambda_init = 0.8 - 0.6 exp(-0.3 l) at layer index l from 0, as the reference
    code computes it (the paper writes l from 1). The paper halves the heads against the
    Transformer it compares with, to keep the parameters: ``model.n_heads`` counts differential
    heads. Each softmax map is the attention kernel's own, so the encoding's rotation, bias and
    decay enter both; hooks that change the values (``value``, ``features``), replace the softmax
    (``normalize``) or transform between query and key (``transition``) are refused.

    ``model.sinks``: learned attention sinks as in gpt-oss (OpenAI 2025, gpt-oss model card;
    transformers' ``GptOssAttention``, whose ``sinks`` this follows): one logit s_h per head of the
    kernel (per sub-head under ``model.differential``), a column every query sees appended to the
    scaled logits (after the encoding's bias) with no value, so softmax's weights over the real keys
    sum to 1 - exp(s_h) / Z and a head may attend to nothing; N(0, 0.02) at init, as transformers'
    ``GptOssPreTrainedModel`` initialises it, no weight decay (a vector). Unlike StreamingLLM's sinks
    (``eval.extension=sinks``: the first tokens kept in a window) it is trained and holds no token.
    It runs the explicit query-chunk kernel; encodings that replace the softmax (``normalize``) or
    transform keys (``transition``) are refused."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        hs = cfg.d_model // cfg.n_heads
        qk = hs // 2 if cfg.differential else hs  # the head dim of q and k (a sub-head's, differential)
        self.q_norm, self.k_norm = (nn.RMSNorm(qk, eps=1e-6), nn.RMSNorm(qk, eps=1e-6)) if cfg.qk_norm else (None, None)
        self.diff = None
        if cfg.differential:  # the reference code's lambda_q1, lambda_k1, lambda_q2, lambda_k2 and subln
            self.diff = nn.ParameterDict({n: nn.Parameter(torch.zeros(qk).normal_(0, 0.1))
                                          for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")})
            self.subln = nn.RMSNorm(hs, eps=1e-5)
        self.sinks = nn.Parameter(torch.zeros(cfg.kernel_heads()).normal_(0, 0.02)) if cfg.sinks else None
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        # model.gate: a module only where gated, so other runs' state dicts (and inits) are as before
        self.gate = None if cfg.gate == "none" else \
            nn.Linear(cfg.d_model, cfg.d_model if cfg.gate == "elementwise" else cfg.n_heads, bias=False)
        self.chunk, self.window = cfg.attn_chunk, cfg.window
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, enc: PositionEncoding, positions, layer: int, cache: dict):
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)
        if self.diff is not None:  # (B, H, T, hs) -> (B, 2H, T, hs / 2): head i's halves are sub-heads 2i, 2i + 1
            q, k = (t.reshape(B, self.n_heads, T, 2, -1).transpose(2, 3).reshape(B, 2 * self.n_heads, T, -1)
                    for t in (q, k))
            v = v.repeat_interleave(2, dim=1)
        if self.q_norm is not None:  # in fp32, as Qwen3's RMSNorm (and no bf16 input beside an fp32 gain)
            q, k = self.q_norm(q.float()).to(q.dtype), self.k_norm(k.float()).to(k.dtype)
        ext = enc.extension  # eval.extension (posbench.encodings.extension), None but at evaluation
        if ext is not None and ext.sets_positions and (self.diff is not None or self.sinks is not None):
            option = "model.differential=true" if self.diff is not None else "model.sinks=true"
            raise PosbenchError(f"eval.extension={ext.method} is not available for {option}: it computes "
                                "plain softmax maps itself; valid: an extension that leaves the attention to the "
                                "model (logn) or none")
        if ext is not None and ext.sets_positions:  # the rotation (and the visible keys) are part of the attention
            y = enc.extended_attention(q, k, v, positions, layer)
        else:
            q, k = enc.rotate(q, k, positions, layer)  # (B, nh, T, hs)
            feats = carried_features(enc, positions, layer, B)  # the features hook (TAPE), else None
            if feats is not None:  # q, k by the layer's features; the features ride along as more value dims
                q, k = enc.rotate_features(q, k, feats, layer)
                v = torch.cat((v, feats.to(v.dtype)), dim=-1)
            if "length_scaling" in cache:  # model.length_scaling: q times a factor of the keys it sees
                q = cache["length_scaling"](q, cache["key_counts"], layer)
            if ext is not None and ext.method == "logn":
                q = q * ext.query_scale(positions)[:, None].to(q.dtype)
            y = causal_attention(q, k, v, enc, positions, layer, self.chunk, cache, cumulative_decay(enc, x, layer),
                                 layer_window(enc, layer, self.window), token_transforms(enc, x, layer), self.sinks)
            if feats is not None:  # sum_j A_ij e_j, for the block's update_features
                y, cache["attended"] = y.split((D // self.n_heads, feats.shape[-1]), dim=-1)
        if self.diff is not None:
            y = self.differential(y, layer)
        if self.gate is not None:  # (B, T, D or H) -> (B, H, T, hs or 1)
            y = y * torch.sigmoid(self.gate(x)).view(B, T, self.n_heads, -1).transpose(1, 2).to(y.dtype)
        return self.dropout(self.proj(y.transpose(1, 2).reshape(B, T, D)))

    def differential(self, y: torch.Tensor, layer: int) -> torch.Tensor:
        """(B, 2H, T, hs) sub-head outputs -> (B, H, T, hs): A1 v - lambda A2 v, normed, x (1 - lambda_init)."""
        p = self.diff
        init = 0.8 - 0.6 * math.exp(-0.3 * layer)
        lam = torch.exp((p["lambda_q1"] * p["lambda_k1"]).sum()) - torch.exp((p["lambda_q2"] * p["lambda_k2"]).sum())
        lam = lam + init
        out = y[:, 0::2] - lam.to(y.dtype) * y[:, 1::2]
        wide = torch.promote_types(out.dtype, torch.float32)  # the norm in fp32 at least, as the reference's RMSNorm
        return self.subln(out.to(wide)).to(y.dtype) * (1 - init)


def carried_features(enc: PositionEncoding, positions: torch.Tensor, layer: int, batch: int) -> torch.Tensor | None:
    """The position features (B, H, T, F) of ``layer`` for an encoding with the ``features`` hook, else
    None: made by ``enc.features`` at layer 0, then the ones each block left on ``enc.carried``. They
    live on the encoding, not in the per-forward cache, so any walk through the blocks in order
    (the conformance checks', the tests' own) carries them as the model does."""
    if "features" not in enc.hooks():
        return None
    if layer == 0:
        enc.carried = enc.features(positions, batch)
    if enc.carried is None:
        raise PosbenchError(f"layer {layer} of {enc.name!r} has no position features: the blocks run from layer 0")
    return enc.carried


def mlp_width(cfg: ModelConfig, kind: str) -> int:
    """The MLP width of a block of type ``kind`` (``model.layers``): ``d_ff`` for attention; for another
    layer, ``d_ff`` less round((P_layer - P_attention) / (2 d_model + 1)), the MLP units (2 d_model + 1
    parameters each) that hold the difference between the layer's parameters and the attention
    layer's (with the same model options), so every block, and the model, holds the attention
    model's parameters to within one unit a block. The layers' own shapes stay their references'."""
    if kind == "a":
        return cfg.d_ff
    with torch.device("meta"):  # shapes only: nothing allocated
        layer, attention = MIXERS[kind](cfg), Attention(cfg)
    extra = sum(p.numel() for p in layer.parameters()) - sum(p.numel() for p in attention.parameters())
    width = cfg.d_ff - round(extra / (2 * cfg.d_model + 1))
    if width < 1:
        raise PosbenchError(f"model.layers={cfg.layers!r}: a {kind!r} layer holds {extra:,} parameters more than "
                            f"attention, more than an MLP of model.d_ff={cfg.d_ff} can give up; valid: a larger d_ff")
    return width


class Block(nn.Module):
    """A pre-LN block: softmax attention (``kind`` "a") or a layer of :mod:`posbench.model.recurrent`
    (``self.mixer``, its MLP narrowed by :func:`mlp_width`), then the MLP."""

    def __init__(self, cfg: ModelConfig, kind: str = "a"):
        super().__init__()
        self.kind = kind
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        if kind == "a":  # attribute names as before layer types existed: checkpoints load as they were
            self.attn = Attention(cfg)
        else:
            self.mixer = MIXERS[kind](cfg)
        width = mlp_width(cfg, kind)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, width), nn.GELU(),
                                 nn.Linear(width, cfg.d_model), nn.Dropout(cfg.dropout))

    def forward(self, x, enc, positions, layer, cache):
        mix = self.attn if self.kind == "a" else self.mixer
        x = x + mix(self.ln1(x), enc, positions, layer, cache)
        h = self.mlp(self.ln2(x))
        attended = cache.pop("attended", None)
        if attended is not None:  # the next layer's position features (none after the last layer)
            last = layer == enc.dims.n_layers - 1
            enc.carried = None if last else enc.update_features(enc.carried, attended, h, layer)
        return x + h


class LanguageModel(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int, encoding: PositionEncoding):
        super().__init__()
        self.cfg, self.vocab_size, self.encoding = cfg, vocab_size, encoding
        refused = sorted(DIFF_REFUSES & set(encoding.hooks())) if cfg.differential else []
        if refused:
            raise PosbenchError(f"model.differential=true takes no {refused[0]!r} hook (encoding {encoding.name!r}): "
                                "it changes the values or the softmax the two maps share; valid: an encoding "
                                f"without the {', '.join(sorted(DIFF_REFUSES))} hooks")
        if set(cfg.layer_kinds()) != {"a"} and "features" in encoding.hooks():
            raise PosbenchError(f"model.layers={cfg.layers!r} takes no 'features' hook (encoding {encoding.name!r}): "
                                "its position features pass through every layer; valid: model.layers=a")
        if cfg.sinks:
            refuse_sinks(encoding)
        self.tok_emb = nn.Embedding(vocab_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, kind) for kind in cfg.layer_kinds())
        self.ln_f = nn.LayerNorm(cfg.d_model)
        # model.length_scaling: a module only where scaling is on, so other runs' state dicts are as before
        self.length_scaling = (LengthScaling(cfg.length_scaling, cfg.n_layers, cfg.n_heads, encoding.dims.train_len,
                                             cfg.ssmax_init) if cfg.length_scaling != "none" else None)
        self._init_weights()
        self.emb_scale = cfg.embed_factor()  # the same for every encoding (model.embed_scale)

    def _init_weights(self):
        """GPT-2 init, N(0, 0.02), for every encoding. The token embeddings are then multiplied by
        sqrt(d_model) under ``model.embed_scale=sqrt_d`` (fairseq, Vaswani et al.); the layers of
        ``model.layers`` take the same init (flash-linear-attention's models init Gated DeltaNet's
        matrices and convolutions at N(0, 0.02) too) but for ``MIXER_OWN``; initialising
        them at N(0, d^-0.5) as well (tensor2tensor/fairseq) was measured worse here with tied
        embeddings (README, "Reference results")."""
        for name, p in self.named_parameters():
            if name.startswith(OWN_PARAMETERS) or (".mixer." in name and name.endswith(MIXER_OWN)):
                continue  # encodings, the length scaling and the layers' gates initialise their own
            if p.dim() >= 2:
                # GPT-2: N(0, 0.02), residual projections scaled by 1/sqrt(2 * n_layers)
                residual = name.endswith((".proj.weight", "mlp.2.weight"))
                std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if residual else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    @staticmethod
    def dims(cfg: ModelConfig, train_len: int, vocab_size: int = 0) -> ModelDims:
        """The shape the encoding is built for: differential attention's sub-heads are its heads."""
        return ModelDims(cfg.d_model, cfg.kernel_heads(), cfg.n_layers, train_len, vocab_size)

    def hidden(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """idx: (B, T) token ids -> final hidden states (B, T, D), before the output embedding.
        ``positions``: (T,) strictly increasing integers shared by the batch (randomized
        positions, :mod:`posbench.encodings.randomized`); None: 0 .. T-1."""
        cache: dict = {}  # per-forward values shared by layers (e.g. a layer-invariant bias)
        if positions is None:  # its ends noted: the encodings size their tables with no device read
            positions = note_span(torch.arange(idx.shape[1], device=idx.device), 0, idx.shape[1] - 1)
            cache["contiguous"] = True  # attention may slice one Toeplitz bias; it checks given positions itself
        else:
            check_positions(positions, idx.shape[1])
            first, last = span(positions)  # read where they were drawn (the sampler's: the CPU)
            positions = note_span(positions.to(idx.device), first, last)
        if self.length_scaling is not None:
            cache["length_scaling"], cache["key_counts"] = self.length_scaling, key_counts(idx.shape[1], idx.device)
        x = self.tok_emb(idx) * self.emb_scale  # (B, T, D)
        x = self.drop(self.encoding.embed(x, positions, idx))
        for layer, block in enumerate(self.blocks):
            x = block(x, self.encoding, positions, layer, cache)
        return self.ln_f(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """idx: (B, T) token ids -> logits (B, T, vocab); with ``targets`` (B, T) the mean
        next-token cross-entropy instead, without making the logits (:mod:`posbench.model.loss`), over the
        targets >= 0 (a negative target, ``posbench.data.tasks.IGNORE``, is skipped). ``positions``: see
        :meth:`hidden`."""
        hidden = self.hidden(idx, positions)
        if targets is not None:  # IGNORE targets (a task's prompt and padding): the loss skips them
            return linear_cross_entropy(hidden, self.tok_emb.weight, targets)
        return self.logits(hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits (..., vocab) of hidden states (..., D): the tied output embedding."""
        return hidden @ self.tok_emb.weight.t()

    def token_nll(self, idx: torch.Tensor, targets: torch.Tensor,
                  positions: torch.Tensor | None = None) -> torch.Tensor:
        """Per-token NLL (B, T) in fp32 (see :meth:`head_nll`); ``positions``: see :meth:`hidden`."""
        return self.head_nll(self.hidden(idx, positions), targets)

    def head_nll(self, hidden: torch.Tensor, targets: torch.Tensor, rows: int = 4096) -> torch.Tensor:
        """NLL of ``targets`` (...,) given hidden states (..., D), in fp32, the logits made ``rows``
        tokens at a time: 16,384 tokens with an 8k vocabulary never hold more than rows x vocab
        fp32 logits at once."""
        h, y = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
        nll = [F.cross_entropy((h[i:i + rows] @ self.tok_emb.weight.t()).float(), y[i:i + rows], reduction="none")
               for i in range(0, len(y), rows)]
        return torch.cat(nll).view(targets.shape)

    def check_method(self, ext, scaling: str = "none") -> None:
        """One line unless the inference-time method ``ext`` (and the RoPE ``scaling``) runs on this
        model: it has an attention layer to act in (``model.layers``), the encoding takes it
        (:meth:`PositionEncoding.check_extension`), and a method that sets positions (Self-Extend,
        ReRoPE, llama3, STRING, sinks, LM-Infinite, DCA), computing the whole attention itself, meets no
        sliding window, trained length scaling, learned sinks or differential attention it would drop.
        In a model with other layers too, a method acts on its attention layers alone."""
        cfg = self.cfg
        if "a" not in cfg.layer_kinds():
            for key, value in (("eval.extension", ext.method), ("eval.rope_scaling", scaling)):
                if value != "none":
                    raise PosbenchError(f"{key}={value} acts in attention layers; this run's model.layers="
                                        f"{cfg.layers} has none; valid here: {key}=none")
        self.encoding.check_extension(ext)
        if not ext.sets_positions:
            return
        for key, on in (("model.sinks", cfg.sinks), ("model.differential", cfg.differential)):
            if on:
                raise PosbenchError(f"eval.extension={ext.method} computes plain softmax attention without {key}; "
                                    f"this run has {key}=true; valid here: eval.extension=none or logn")
        for key, value, valid in (("model.window", cfg.window, 0),
                                  ("model.length_scaling", cfg.length_scaling, "none")):
            if value != valid:
                raise PosbenchError(f"eval.extension={ext.method} computes global attention without {key}; this run "
                                    f"has {key}={value}; valid here: eval.extension=none or logn")

    def option_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The parameters a model option adds to the attention (gate, differential lambdas and norm,
        sinks) and those of ``model.layers``' layers, by name: the conformance checks' bf16 check asks
        each for a gradient."""
        return [(name, p) for name, p in self.named_parameters() if name.startswith("blocks.")
                and (name.split(".")[2] == "mixer" or name.split(".")[3] in OPTION_MODULES)]

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def param_counts(self) -> dict[str, int]:
        """{'params': every parameter once (the tied output embedding once), 'pos_params': the
        position encoding's (``encoding.*``), which holds any input table an encoding adds:
        complex's per-word amplitude, frequency and phase, (V, 3D/2)."""
        pos = sum(p.numel() for name, p in self.named_parameters() if name.startswith("encoding."))
        return {"params": self.num_params(), "pos_params": pos}
