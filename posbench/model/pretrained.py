"""Pretrained causal language models (Hugging Face transformers) on posbench's ladder and probes.

``posbench eval pretrained=PATH`` measures a model trained elsewhere with the same protocols as
posbench's own runs: every length scores the same tokens, sliding windows, bits per byte,
per-position loss, token NLL for paired intervals, probes. PATH is a local model directory
(config, weights and tokenizer, as ``save_pretrained`` writes them) or a ``.gguf`` file
(transformers reads GGUF with ``gguf_file=``; the ``gguf`` package). Nothing is downloaded:
hub names are refused with one line.

:class:`PretrainedLM` wraps the transformers model in the interface the ladder and the probes
use for posbench's :class:`~posbench.model.transformer.LanguageModel`: ``hidden(ids, positions)``,
``head_nll(hidden, targets)`` (the logits made a few thousand rows at a time, so a 32k window
with a 49k vocabulary never holds its logits at once), ``forward(ids) -> logits``,
``param_counts()`` and an ``encoding`` whose ``dims.train_len`` is the model's trained context
(``original_max_position_embeddings``, else ``max_position_embeddings``/``n_positions``): the
ladder's multiples are of that context. A model with a learned position table (GPT-2) cannot
represent positions past it: those lengths are ``n/a``, as for posbench's ``learned``.

A model whose rotary embedding differs by layer type (Gemma 3: sliding-window layers with base
10k beside global layers with base 1M; transformers keys ``rope_parameters`` by layer type and
its rotary module holds one ``{layer_type}_inv_freq`` per type) is scaled per layer type as
transformers' own config applies a ``rope_scaling`` (:func:`scaled_layer_types`): for Gemma 3,
PI, NTK, dynamic NTK and YaRN set the frequencies of the global (``full_attention``) layers
only; the local (``sliding_attention``) layers keep their trained frequencies, as in Gemma 3
checkpoints whose config carries a scaling. A local layer sees distances up to its window (512
for Gemma 3 270M), inside the trained context at every length, so a scaling would only compress
distances it was trained on. The training-free extensions act on the same layers: the global
layers attend under the method with their own frequencies (``full_attention_inv_freq``), the
sliding layers keep their window and trained positions (:func:`windowed_attention`), so sinks,
LM-Infinite, Dual Chunk Attention, STRING, Self-Extend, ReRoPE, log-n and llama3 change what the
global layers see, the only layers that reach past 512 tokens. A model whose extension would
need two scaled frequency sets, or whose attention logits are soft-capped (Gemma 2), is refused
with one line.

``bos`` is the window's beginning-of-sequence policy (``posbench eval``'s ``bos=auto`` picks the one the
model was trained with, :func:`trained_bos`): ``first`` scores the corpus
as tokenized, where the tokenizer's BOS (if it adds one) starts each document, so the first
window begins with it and later windows begin mid-text; ``every`` puts the model's BOS before
every window that does not begin with it, at position 0 (the window's tokens at positions 1..L;
its output dropped, so the same targets are scored), as models trained always to see BOS first
(Gemma) expect. Its rows carry the model name with ``+bos``, so they go to their own output
folder and never replace the rows of ``first``.

Transformers and its helpers are an optional extra (``pip install "posbench[hf]"``); without
them one line says what to install.
"""

from __future__ import annotations

import functools
import json
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..config import BOS_SUFFIX
from ..encodings import PositionRangeError
from ..errors import PosbenchError
from ..methods import Rotation, scaling, scaling_factor, scalings

EXTRA = 'pip install "posbench[hf]"'
ROTARY_KEYS = ("rope_theta", "rope_parameters", "rotary_dim", "rotary_pct")


def require_transformers():
    """The transformers module, or one line naming the extra to install."""
    try:
        import transformers
    except ImportError as e:
        raise PosbenchError(f"pretrained= needs the transformers package ({e}); valid: {EXTRA}") from e
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


@dataclass
class PositionScheme:
    """What the ladder and the report read of a pretrained model's positions: its scheme's name
    (``rope``, ``alibi`` or ``learned``, as posbench's encodings are named) and ``dims.train_len``,
    the trained context."""

    name: str
    train_len: int
    limit: int | None  # positions a learned table holds; None: any
    rotary: nn.Module | None = None  # the model's rotary embedding module (rope only)
    window: int | None = None  # the length of the window now running (set by PretrainedLM), BOS excluded

    @property
    def dims(self):
        return self

    @property
    def reference_len(self) -> int:
        """The context a RoPE scaling's factor is relative to: the trained one."""
        return self.train_len

    @property
    def layer_types(self) -> tuple[str, ...] | None:
        """The layer types of a rotary module that holds frequencies per type (Gemma 3), else None."""
        return rope_layer_types(self.rotary.config) if self.rotary is not None else None

    def _buffers(self) -> list[str | None]:
        """The layer types whose frequencies a scaling sets: [None] (the one ``inv_freq``) for a
        model with one rotary embedding, else :func:`scaled_layer_types`."""
        return [None] if self.layer_types is None else list(scaled_layer_types(self.rotary.config))

    @contextmanager
    def scaled(self, kind: str, factor: float | None):
        """RoPE scaling ``kind`` through the model's own rotary module (:func:`scaled_inv_freq`):
        before each forward pass the module's inverse frequencies and attention factor are set for
        the window's length (s = ``factor``, or max(1, window / train_len) where null, as for
        posbench's rotary encodings; the trained ones where s = 1), and restored afterwards. Per
        layer type where the module holds several (module docstring): the types a transformers
        ``rope_scaling`` acts on are set, the others keep their trained frequencies."""
        rotary = self.rotary
        if rotary is None:
            raise PosbenchError(f"eval.rope_scaling={kind}: this model has no rotary module to scale; "
                                "valid: eval.rope_scaling=none")
        types = self._buffers()
        prefix = {t: "" if t is None else f"{t}_" for t in types}
        saved = {t: (getattr(rotary, f"{prefix[t]}inv_freq").clone(), getattr(rotary, f"{prefix[t]}attention_scaling"))
                 for t in types}

        def before(module, args, kwargs):
            layer_type = args[2] if len(args) > 2 else kwargs.get("layer_type")
            if layer_type not in prefix:  # a layer type the scaling leaves as trained
                return
            positions = args[1] if len(args) > 1 else kwargs.get("position_ids")
            window = self.window or (int(positions.max()) + 1 if positions is not None else int(args[0].shape[1]))
            s = scaling_factor(kind, factor, window, self.train_len)
            inv_freq, attention = saved[layer_type] if s == 1.0 else \
                scaled_inv_freq(module.config, kind, s, self.train_len, layer_type)  # s = 1: as trained
            buffer = getattr(module, f"{prefix[layer_type]}inv_freq")
            buffer.copy_(inv_freq.to(buffer.device))
            setattr(module, f"{prefix[layer_type]}attention_scaling", attention)

        hook = rotary.register_forward_pre_hook(before, with_kwargs=True)
        try:
            yield self
        finally:
            hook.remove()
            for t, (inv_freq, attention) in saved.items():
                getattr(rotary, f"{prefix[t]}inv_freq").copy_(inv_freq)
                setattr(rotary, f"{prefix[t]}attention_scaling", attention)

    def check_extension(self, ext) -> str | None:
        """One line unless ``ext`` can run on this model (``none`` runs on any). -> the layer type
        whose rotary frequencies it acts on (None: the model's one ``inv_freq``, or ``none``)."""
        if ext.method == "none":
            return None
        if self.rotary is None:
            raise PosbenchError(f"eval.extension={ext.method} works on rotary (RoPE) models; this model's positions "
                                f"are {self.name!r}; valid: eval.extension=none")
        if self.layer_types is None:
            return None
        types, cap = self._buffers(), getattr(self.rotary.config, "attn_logit_softcapping", None)
        why = (f"this model's scaled layer types are {', '.join(types)}" if len(types) != 1 else
               f"this model caps its attention logits at {cap}" if cap else None)
        if why:
            raise PosbenchError(f"eval.extension={ext.method} acts on one layer type's rotary frequencies with "
                                f"uncapped logits; {why}; valid: eval.extension=none, or an eval.rope_scaling "
                                f"({', '.join(name for name in scalings() if name != 'none')})")
        return types[0]

    @contextmanager
    def extended(self, ext):
        """A training-free extension (:class:`posbench.encodings.extension.Extension`) through transformers'
        attention interface, for the block; nothing for ``none``. On a model with a rotary embedding
        per layer type, the layers a RoPE scaling acts on (Gemma 3's global layers) attend under the
        method with their frequencies and the sliding layers as trained (module docstring)."""
        layer_type = self.check_extension(ext)
        if ext.method == "none":
            yield self
            return
        from ..encodings import extension

        inv_freq = getattr(self.rotary, "inv_freq" if layer_type is None else f"{layer_type}_inv_freq")
        function = extension.hf_attention if layer_type is None else extended_global_layers
        extension._ACTIVE.update(ext=ext, inv_freq=inv_freq.detach().clone())
        try:
            with attention_implementation(self.rotary.config, extension.HF_NAME, function):
                yield self
        finally:
            extension._ACTIVE.clear()


@contextmanager
def attention_implementation(config, name: str, function):
    """transformers' attention of the model ``config`` belongs to through ``function`` (registered
    in its AttentionInterface as ``name``) for the block, the model's own implementation after."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, function)
    saved, config._attn_implementation = config._attn_implementation, name
    try:
        yield
    finally:
        config._attn_implementation = saved


def rope_layer_types(config) -> tuple[str, ...] | None:
    """The layer types of a config whose ``rope_parameters`` are keyed by layer type (Gemma 3:
    ``sliding_attention``, ``full_attention``), else None (one set of rope parameters)."""
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict) or not params:
        return None
    nested = getattr(config, "nested_rope_parameter_keys", None)  # transformers' own test, where it has one
    types = tuple(nested(params)) if nested else tuple(t for t, value in params.items() if isinstance(value, dict))
    return types or None


def scaled_layer_types(config) -> tuple[str, ...]:
    """The layer types a RoPE scaling acts on, as transformers defines it: those whose parameters
    a ``rope_scaling`` given to the model's config class lands in (Gemma 3: ``full_attention``;
    its ``sliding_attention`` layers keep theirs)."""
    types = rope_layer_types(config) or ()
    try:
        probe = type(config)(rope_scaling={"rope_type": "linear", "factor": 2.0})
        params = probe.rope_parameters
    except Exception as e:  # a config class that cannot be built from its defaults
        raise PosbenchError(f"eval.rope_scaling: transformers' {type(config).__name__} cannot say which layer types "
                            f"a rope_scaling acts on ({type(e).__name__}); valid: eval.rope_scaling=none") from e
    scaled = tuple(t for t in types if (params.get(t) or {}).get("rope_type") == "linear")
    if not scaled:
        raise PosbenchError(f"eval.rope_scaling: transformers' {type(config).__name__} applies a rope_scaling to none "
                            f"of the layer types {', '.join(types)}; valid: eval.rope_scaling=none")
    return scaled


def scaled_inv_freq(config, kind: str, factor: float, train_len: int,
                    layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, attention factor) that a model's rotary module holds under
    posbench's RoPE scaling ``kind`` at s = ``factor``: the scaling's own class
    (:mod:`posbench.methods.rope`, the one implementation posbench's rotary runs use too) on the
    config's base and rotary dims (``head_dim`` x ``partial_rotary_factor``), relative to the
    context ``train_len``. ``layer_type``: the rope parameters of that layer type (a config keyed
    by layer type, Gemma 3), each type its own base. The scaling replaces a ``rope_scaling`` the
    config may carry: it starts from RoPE's unscaled frequencies. ``tests/test_pretrained.py``
    checks each against Hugging Face's rope functions, ``tests/test_gemma3.py`` against
    transformers' Gemma 3 rotary module."""
    params = config.rope_parameters if layer_type is None else config.rope_parameters[layer_type]
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head * params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None) or 1.0))
    method = scaling(kind)
    return method.frequencies(Rotation(float(params["rope_theta"]), dim, train_len), factor), \
        method.attention_factor(factor)


def position_scheme(config) -> PositionScheme:
    """The position scheme of a transformers config, and its trained context."""
    get = lambda *keys: next((getattr(config, k) for k in keys if getattr(config, k, None)), None)  # noqa: E731
    rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
    context = (rope.get("original_max_position_embeddings") if isinstance(rope, dict) else None) or \
        get("max_position_embeddings", "n_positions", "seq_length", "max_seq_len")
    attn = getattr(config, "attn_config", None)
    alibi = config.model_type == "bloom" or bool(getattr(config, "alibi", False)) or \
        bool(attn.get("alibi") if isinstance(attn, dict) else getattr(attn, "alibi", False))
    if alibi:
        return PositionScheme("alibi", int(context or 2048), None)
    if any(getattr(config, k, None) is not None for k in ROTARY_KEYS):
        return PositionScheme("rope", int(context), None)
    if context is None:
        raise PosbenchError(f"pretrained model of type {config.model_type!r} names no trained context "
                            "(max_position_embeddings / n_positions); valid: a causal LM whose config has one")
    return PositionScheme("learned", int(context), int(context))


BOS_POLICIES = ("first", "every")  # where a window gets the model's beginning-of-sequence token (module docstring)
BOS_CHOICES = ("auto", *BOS_POLICIES)  # bos=: auto is the policy the model trained with (trained_bos)


def trained_bos(path: str) -> str:
    """``bos=auto``: the BOS policy a model was trained with, as its tokenizer says: ``every`` where
    it adds BOS to every sequence it encodes (a GGUF's ``tokenizer.ggml.add_bos_token``, a
    folder's ``add_bos_token`` in tokenizer_config.json: true for Gemma 3, false for SmolLM2),
    else ``first``."""
    source = Path(path).expanduser()
    if source.suffix == ".gguf":
        flag = _gguf_value(str(source), "tokenizer.ggml.add_bos_token")
    else:
        found = source / "tokenizer_config.json"
        flag = json.loads(found.read_text()).get("add_bos_token") if found.is_file() else None
    return "every" if flag else "first"


@functools.lru_cache(maxsize=8)
def _gguf_value(path: str, key: str):
    """A scalar of a GGUF file's header (None where it has none), read without its tensors."""
    try:
        from gguf import GGUFReader
    except ImportError as e:
        raise PosbenchError(f"reading {path} needs the gguf package ({e}); valid: pip install \"posbench[hf]\"") from e
    try:
        field = GGUFReader(path).fields.get(key)
    except (OSError, ValueError, struct.error) as e:
        raise _cannot_load(path, e) from e
    return None if field is None or not field.data else field.parts[field.data[0]].tolist()[0]


class PretrainedLM(nn.Module):
    """A transformers causal LM behind posbench's model interface (module docstring). ``bos``:
    ``first`` or ``every`` (:data:`BOS_POLICIES`), ``bos_id`` the model's BOS token."""

    def __init__(self, model, name: str, source: str, bos: str = "first", bos_id: int | None = None):
        super().__init__()
        if bos not in BOS_POLICIES:
            raise PosbenchError(f"bos={bos!r} is not a BOS policy; valid: {', '.join(BOS_POLICIES)}")
        bos_id = bos_id if bos_id is not None else getattr(model.config, "bos_token_id", None)
        if bos == "every" and bos_id is None:
            raise PosbenchError(f"bos=every: {name} names no beginning-of-sequence token; valid: bos=first")
        self.model, self.source, self.bos, self.bos_id = model, source, bos, bos_id
        self.name = name + BOS_SUFFIX[bos]  # rows of the two policies never replace each other
        self.encoding = position_scheme(model.config)
        if self.encoding.name == "rope":
            self.encoding.rotary = getattr(model.base_model, "rotary_emb", None)
        self.head = model.get_output_embeddings()
        config = model.config
        layer_types = getattr(config, "layer_types", None) or ()
        self.windowed = (getattr(config, "sliding_window", None) is not None and "sliding_attention" in layer_types
                         and not getattr(config, "attn_logit_softcapping", None))

    def check_method(self, ext, scaling: str = "none") -> None:
        """One line unless the inference-time method ``ext`` runs on this model (its position scheme
        says; RoPE scalings are checked where the eval config is read)."""
        self.encoding.check_extension(ext)

    def _check(self, ids: torch.Tensor, positions: torch.Tensor | None, extra: int = 0) -> None:
        """Set the window's length for a scaling; PositionRangeError past a learned table
        (``extra``: the BOS put before the window)."""
        top = ids.shape[-1] if positions is None else int(positions.max()) + 1
        self.encoding.window = top
        if self.encoding.limit is not None and top + extra > self.encoding.limit:
            raise PositionRangeError(f"position {top + extra - 1} is past the {self.encoding.limit}-entry learned "
                                     f"position table of {self.name}")

    def _run(self, ids: torch.Tensor, positions: torch.Tensor | None, body: bool) -> torch.Tensor:
        """Last hidden states (``body``) or logits of ``ids`` (B, T), under the BOS policy: with
        ``every``, the rows that do not begin with BOS get it at position 0, their tokens at
        positions + 1, and its output is dropped."""
        def call(x, pos):
            kwargs = {} if pos is None else {"position_ids": pos.expand(x.shape[0], -1)}
            with self._window_attention():
                out = (self.model.base_model if body else self.model)(input_ids=x, use_cache=False, **kwargs)
            return out.last_hidden_state if body else out.logits

        prefix = ids[:, 0] != self.bos_id if self.bos == "every" else None  # (B,) rows that get BOS
        if prefix is None or not prefix.any():
            self._check(ids, positions)
            return call(ids, positions)
        self._check(ids, positions, extra=1)
        pos = positions if positions is not None else torch.arange(ids.shape[1], device=ids.device)
        x = torch.cat([torch.full_like(ids[prefix, :1], self.bos_id), ids[prefix]], 1)  # (b, 1 + T)
        shifted = call(x, torch.cat([pos.new_zeros(1), pos + 1]))[:, 1:]
        if prefix.all():
            return shifted
        out = shifted.new_empty((ids.shape[0], *shifted.shape[1:]))
        out[prefix], out[~prefix] = shifted, call(ids[~prefix], positions)
        return out

    @contextmanager
    def _window_attention(self):
        """A model with sliding-window layers (Gemma 3: 5 of every 6) attends through
        :func:`windowed_attention` for the block, so no (T, T) mask is built; others as loaded, and
        under an extension (:func:`extended_global_layers`, whose sliding layers are windowed)."""
        from ..encodings.extension import HF_NAME

        if not self.windowed or self.model.config._attn_implementation == HF_NAME:
            yield
            return
        with attention_implementation(self.model.config, WINDOWED, windowed_attention):
            yield

    def hidden(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Last hidden states (B, T, D) of the model's body; ``positions`` (T,) its position ids."""
        return self._run(ids, positions, body=True)

    HEAD_BYTES = 2 ** 30  # the most one slice of fp32 logits may take: head_rows x vocabulary x 4 bytes

    @property
    def head_rows(self) -> int:
        """Tokens whose logits head_nll makes at a time (the preflight reads it): 2,048, fewer where
        the vocabulary would make that slice more than :attr:`HEAD_BYTES` (Gemma 3's 262k: 1,024)."""
        return int(min(2048, max(64, self.HEAD_BYTES // (4 * self.head.weight.shape[0]))))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head's logits of ``hidden``, soft-capped as the model's own forward caps them
        (``final_logit_softcapping``: c tanh(z / c), Gemma 2 and 3), in place: one (rows, vocab)
        tensor, not four."""
        logits = self.head(hidden)
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        return logits if not cap else logits.div_(cap).tanh_().mul_(cap)

    def head_nll(self, hidden: torch.Tensor, targets: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        """NLL of ``targets`` (...,) in fp32, the logits made ``rows`` tokens at a time."""
        rows = rows or self.head_rows
        h, y = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
        nll = [F.cross_entropy(self.logits(h[i:i + rows]).float(), y[i:i + rows], reduction="none")
               for i in range(0, len(y), rows)]
        return torch.cat(nll).view(targets.shape)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self._run(ids, None, body=False)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def param_counts(self) -> dict[str, int]:
        pos = sum(p.numel() for name, p in self.model.named_parameters()
                  if any(k in name for k in ("wpe", "position_embeddings", "embed_positions")))
        return {"params": self.num_params(), "pos_params": pos}


def plain_nll(model, ids: torch.Tensor, length: int) -> float:
    """Mean NLL of a transformers causal LM ``model`` over windows of ``length`` of ``ids`` (n + 1
    tokens, n a multiple of ``length``), one window a call, from its whole logits and an fp32 cross
    entropy: what a one-off perplexity script computes (jquesnelle/yarn's ``eval/perplexity.py``),
    the reference scripts/pretrained_speed.py and scripts/long_eval_speed.py set the ladder against."""
    x, y = ids[:-1].view(-1, length), ids[1:].view(-1, length)
    total = 0.0
    for i in range(x.shape[0]):
        logits = model(input_ids=x[i:i + 1], use_cache=False).logits
        total += F.cross_entropy(logits[0].float(), y[i], reduction="sum").item()
        del logits
    return total / y.numel()


WINDOWED = "posbench_windowed"  # the attention implementation's name in transformers' AttentionInterface
WINDOW_ROWS = 1024  # queries per chunk in a sliding-window layer


def windowed_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                       sliding_window: int | None = None, **kwargs):
    """transformers' attention-function signature: ``query`` (B, H, T, hs), ``key``/``value`` (B, H_kv,
    T, hs) -> (output (B, T, H, hs), None). transformers builds no mask for an implementation it
    does not know, so none reaches here. A global layer (``sliding_window`` None) runs
    transformers' own SDPA attention, causal; a sliding-window layer attends in chunks of
    :data:`WINDOW_ROWS` queries, each against the keys of its window only (j > i - window, j <= i,
    as transformers' ``sliding_window_overlay``), with that chunk's (rows, keys) boolean mask. The
    model's own SDPA path builds the (T, T) mask of every sliding layer, which at 65,536 tokens is
    4 GiB as booleans and more as the float mask SDPA makes of it: Gemma 3 at 64k was killed at
    23 GB on a 24 GB machine; here the sliding layers hold O(T window) and take O(T window) time."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    if attention_mask is not None or not sliding_window:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling)
    rep = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, rep), repeat_kv(value, rep)
    T = query.shape[2]
    pos = torch.arange(T, device=query.device)
    outs = []
    for s in range(0, T, WINDOW_ROWS):
        e, k0 = min(T, s + WINDOW_ROWS), max(0, s - sliding_window + 1)
        i, j = pos[s:e, None], pos[None, k0:e]
        seen = (j <= i) & (i - j < sliding_window)
        outs.append(F.scaled_dot_product_attention(query[:, :, s:e], key[:, :, k0:e], value[:, :, k0:e],
                                                   attn_mask=seen, dropout_p=dropout, scale=scaling))
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def extended_global_layers(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                           sliding_window: int | None = None, **kwargs):
    """transformers' attention-function signature for a model with sliding and global layers under
    an extension: a sliding layer as trained (:func:`windowed_attention`), a global layer under the
    active method (:func:`posbench.encodings.extension.hf_attention`, with the global layers'
    frequencies that :meth:`PositionScheme.extended` set)."""
    from ..encodings.extension import hf_attention

    if sliding_window:
        return windowed_attention(module, query, key, value, attention_mask, scaling, dropout,
                                  sliding_window=sliding_window, **kwargs)
    return hf_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)


class PieceTokenizer:
    """A ``tokenizers.Tokenizer`` whose ``encode`` leaves out the special tokens a model's
    post-processor adds to a whole text (a Llama tokenizer's ``<s>``): a probe joins pieces it
    encoded one by one, as posbench's own tokenizer (which adds none) does."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def encode(self, text: str):
        return self._tokenizer.encode(text, add_special_tokens=False)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def _fast_tokenizer(tokenizer):
    """The ``tokenizers.Tokenizer`` behind a transformers tokenizer (posbench's corpus code and
    probes speak its API), with the model's end-of-text token."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise PosbenchError(f"the tokenizer of this model ({type(tokenizer).__name__}) has no fast (tokenizers) "
                            "form; valid: a model directory with tokenizer.json")
    return backend, tokenizer.eos_token


@dataclass
class PretrainedDescription:
    """What the rows of a pretrained model name, read without its weights
    (:func:`describe_pretrained`): its name under the BOS policy, its file or folder, and its
    position scheme; :class:`PretrainedLM` answers the same three attributes."""

    name: str
    source: str
    encoding: PositionScheme


def model_name(source: Path, bos: str) -> str:
    """A model's name in result rows: the .gguf file's stem or the folder's name, ``+bos`` under
    ``bos=every`` (rows of the two policies never replace each other)."""
    return (source.stem if source.suffix == ".gguf" else source.name) + BOS_SUFFIX[bos]


def _locate(path: str, bos: str):
    """``pretrained=PATH`` and ``bos`` checked -> (transformers, the path, the folder transformers
    reads, its keyword arguments: ``gguf_file`` for a .gguf file); one line for what cannot be."""
    if bos not in BOS_POLICIES:
        raise PosbenchError(f"bos={bos!r} is not a BOS policy; valid: {', '.join(BOS_POLICIES)}")
    transformers = require_transformers()
    source = Path(path).expanduser()
    gguf = source.suffix == ".gguf"
    if not source.exists():
        raise PosbenchError(f"pretrained={path} does not exist; valid: a local model directory (config.json, "
                            "weights, tokenizer.json) or a .gguf file (nothing is downloaded)")
    if not gguf and not source.is_dir():
        raise PosbenchError(f"pretrained={path} is a file but not a .gguf file; valid: a .gguf file, or a "
                            "directory written by save_pretrained (config.json, weights, tokenizer.json)")
    if not gguf and not (source / "config.json").is_file():
        raise PosbenchError(f"pretrained={path} is a directory without config.json; valid: a directory written "
                            "by save_pretrained, or a .gguf file")
    return transformers, source, *((str(source.parent), {"gguf_file": source.name}) if gguf else (str(source), {}))


def _cannot_load(path: str, e: Exception) -> PosbenchError:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return PosbenchError(f"pretrained={path}: transformers cannot load it ({type(e).__name__}: {first})")


LOAD_ERRORS = (OSError, ValueError, KeyError, ImportError, struct.error)  # struct.error: a truncated .gguf


def describe_pretrained(path: str, bos: str = "first"):
    """-> (:class:`PretrainedDescription`, tokenizers.Tokenizer, end-of-text token) of ``pretrained=PATH``
    from its config and tokenizer alone, no weights: what deciding whether its rows exist needs
    (``posbench study`` plans a pretrained stage with it; a GGUF's header is read, its tensors not)."""
    source = _locate(path, bos)[1]
    config, backend, eos = _config_and_tokenizer(path)
    return PretrainedDescription(model_name(source, bos), str(source), position_scheme(config)), backend, eos


@functools.lru_cache(maxsize=4)
def _config_and_tokenizer(path: str):
    """A model's transformers config, tokenizers.Tokenizer and end-of-text token, kept per path: a
    study plans every method and BOS policy of one model with them, and reading a GGUF's header
    (Gemma 3's 262k-token vocabulary) takes about a minute each time."""
    transformers, source, where, kwargs = _locate(path, "first")
    try:
        config = transformers.AutoConfig.from_pretrained(where, local_files_only=True, **kwargs)
        tokenizer = transformers.AutoTokenizer.from_pretrained(where, local_files_only=True, **kwargs)
    except LOAD_ERRORS as e:
        raise _cannot_load(path, e) from e
    return (config, *_fast_tokenizer(tokenizer))


@contextmanager
def _quiet_gguf():
    """transformers' GGUF loader without its tensor bar ("Converting and de-quantizing GGUF
    tensors"), which it draws with tqdm itself, past ``disable_progress_bar``, on every load."""
    try:
        from transformers import modeling_gguf_pytorch_utils as loader
    except ImportError:
        yield
        return
    bar = loader.tqdm
    loader.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        loader.tqdm = bar


def load_pretrained(path: str, device: torch.device, dtype: str = "auto", bos: str = "first"):
    """-> (:class:`PretrainedLM` on ``device`` in eval mode, tokenizers.Tokenizer, end-of-text
    token). ``dtype``: auto (the checkpoint's own, fp32 on CPU), fp32, bf16; ``bos``: the
    window's BOS policy, first or every (module docstring)."""
    transformers, source, where, kwargs = _locate(path, bos)
    torch_dtype = {"auto": torch.float32 if device.type == "cpu" else "auto", "fp32": torch.float32,
                   "bf16": torch.bfloat16}[dtype]
    try:
        with _quiet_gguf():
            model = transformers.AutoModelForCausalLM.from_pretrained(where, dtype=torch_dtype, local_files_only=True,
                                                                      **kwargs)
        tokenizer = transformers.AutoTokenizer.from_pretrained(where, local_files_only=True, **kwargs)
    except LOAD_ERRORS as e:
        raise _cannot_load(path, e) from e
    backend, eos = _fast_tokenizer(tokenizer)
    bos_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else model.config.bos_token_id
    return PretrainedLM(model.eval(), model_name(source, "first"), str(source), bos, bos_id).to(device), backend, eos
