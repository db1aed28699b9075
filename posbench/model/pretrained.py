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

Transformers and its helpers are an optional extra (``pip install "posbench[hf]"``); without
them one line says what to install.
"""

from __future__ import annotations

import copy
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..encodings import PositionRangeError
from ..encodings.rotary import ntk_base, scaling_factor
from ..errors import PosbenchError

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

    @property
    def dims(self):
        return self

    @contextmanager
    def scaled(self, kind: str, factor: float | None):
        """RoPE scaling ``kind`` through the model's own rotary module and Hugging Face's rope
        functions (:func:`hf_inv_freq`): before each forward pass the module's inverse frequencies
        and attention factor are set for the window's length (s = ``factor``, or max(1, window /
        train_len) where null, as for posbench's rotary encodings), and restored afterwards."""
        rotary = self.rotary
        if rotary is None:
            raise PosbenchError(f"eval.rope_scaling={kind}: this model has no rotary module to scale; "
                                "valid: eval.rope_scaling=none")
        saved = rotary.inv_freq.clone(), rotary.attention_scaling

        def before(module, args):
            positions = args[1] if len(args) > 1 else None
            window = int(positions.max()) + 1 if positions is not None else int(args[0].shape[1])
            inv_freq, attention = hf_inv_freq(module.config, kind, scaling_factor(kind, factor, window, self.train_len),
                                              self.train_len, window)
            module.inv_freq.copy_(inv_freq.to(module.inv_freq.device))
            module.attention_scaling = attention

        hook = rotary.register_forward_pre_hook(before)
        try:
            yield self
        finally:
            hook.remove()
            rotary.inv_freq.copy_(saved[0])
            rotary.attention_scaling = saved[1]


    def check_extension(self, ext) -> None:
        """One line unless ``ext`` can run on this model (``none`` runs on any)."""
        if ext.method != "none" and self.rotary is None:
            raise PosbenchError(f"eval.extension={ext.method} works on rotary (RoPE) models; this model's positions "
                                f"are {self.name!r}; valid: eval.extension=none")

    @contextmanager
    def extended(self, ext):
        """A training-free extension (:class:`posbench.encodings.extension.Extension`) through transformers'
        attention interface, for the block; nothing for ``none``."""
        self.check_extension(ext)
        if ext.method == "none":
            yield self
            return
        from transformers import AttentionInterface

        from ..encodings import extension

        AttentionInterface.register(extension.HF_NAME, extension.hf_attention)
        config = self.rotary.config
        saved = config._attn_implementation
        extension._ACTIVE.update(ext=ext, inv_freq=self.rotary.inv_freq.detach().clone())
        config._attn_implementation = extension.HF_NAME
        try:
            yield self
        finally:
            config._attn_implementation = saved
            extension._ACTIVE.clear()


def hf_inv_freq(config, kind: str, factor: float, train_len: int, window: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, attention factor) of posbench's scaling ``kind`` at ``factor`` from
    Hugging Face's own rope functions on a copy of the model's config: ``pi`` is HF's linear,
    ``yarn`` its yarn (original context ``train_len``), ``dynamic_ntk`` its dynamic at the window's
    length (factor 1, so the base is b (window / train_len)^(d/(d-2)), posbench's dynamic NTK);
    HF has no static NTK, so ``ntk`` is its default with the NTK-aware base
    (:func:`posbench.encodings.rotary.ntk_base`). ``tests/test_pretrained.py`` checks each against
    posbench's rotary functions."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = copy.deepcopy(config)
    params = dict(config.rope_parameters)
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if kind == "ntk":
        params.update(rope_type="default", rope_theta=ntk_base(params["rope_theta"], factor, dim))
    elif kind == "pi":
        params.update(rope_type="linear", factor=factor)
    elif kind == "dynamic_ntk":
        params.update(rope_type="dynamic", factor=1.0, original_max_position_embeddings=train_len)
    elif kind == "yarn":
        params.update(rope_type="yarn", factor=factor, original_max_position_embeddings=train_len)
    config.rope_parameters = params
    if params["rope_type"] == "default":
        base = params["rope_theta"]
        return 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim), 1.0
    extra = {"seq_len": window} if kind == "dynamic_ntk" else {}
    inv_freq, attention = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, None, **extra)
    return inv_freq, float(attention)


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


class PretrainedLM(nn.Module):
    """A transformers causal LM behind posbench's model interface (module docstring)."""

    def __init__(self, model, name: str, source: str):
        super().__init__()
        self.model, self.name, self.source = model, name, source
        self.encoding = position_scheme(model.config)
        if self.encoding.name == "rope":
            self.encoding.rotary = getattr(model.base_model, "rotary_emb", None)
        self.head = model.get_output_embeddings()

    def _check(self, ids: torch.Tensor, positions: torch.Tensor | None) -> None:
        top = ids.shape[-1] if positions is None else int(positions.max()) + 1
        if self.encoding.limit is not None and top > self.encoding.limit:
            raise PositionRangeError(f"position {top - 1} is past the {self.encoding.limit}-entry learned position "
                                     f"table of {self.name}")

    def hidden(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Last hidden states (B, T, D) of the model's body; ``positions`` (T,) its position ids."""
        self._check(ids, positions)
        kwargs = {} if positions is None else {"position_ids": positions.expand(ids.shape[0], -1)}
        return self.model.base_model(input_ids=ids, use_cache=False, **kwargs).last_hidden_state

    head_rows = 2048  # tokens whose logits head_nll makes at a time (the preflight reads it)

    def head_nll(self, hidden: torch.Tensor, targets: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        """NLL of ``targets`` (...,) in fp32, the logits made ``rows`` tokens at a time."""
        rows = rows or self.head_rows
        h, y = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
        nll = [F.cross_entropy(self.head(h[i:i + rows]).float(), y[i:i + rows], reduction="none")
               for i in range(0, len(y), rows)]
        return torch.cat(nll).view(targets.shape)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self._check(ids, None)
        return self.model(input_ids=ids, use_cache=False).logits

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def param_counts(self) -> dict[str, int]:
        pos = sum(p.numel() for name, p in self.model.named_parameters()
                  if any(k in name for k in ("wpe", "position_embeddings", "embed_positions")))
        return {"params": self.num_params(), "pos_params": pos}


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


def load_pretrained(path: str, device: torch.device, dtype: str = "auto"):
    """-> (:class:`PretrainedLM` on ``device`` in eval mode, tokenizers.Tokenizer, end-of-text
    token). ``dtype``: auto (the checkpoint's own, fp32 on CPU), fp32, bf16."""
    transformers = require_transformers()
    source = Path(path).expanduser()
    gguf = source.suffix == ".gguf"
    if not source.exists():
        raise PosbenchError(f"pretrained={path} does not exist; valid: a local model directory (config.json, "
                            "weights, tokenizer.json) or a .gguf file (nothing is downloaded)")
    where, kwargs = (str(source.parent), {"gguf_file": source.name}) if gguf else (str(source), {})
    if not gguf and not source.is_dir():
        raise PosbenchError(f"pretrained={path} is a file but not a .gguf file; valid: a .gguf file, or a "
                            "directory written by save_pretrained (config.json, weights, tokenizer.json)")
    if not gguf and not (source / "config.json").is_file():
        raise PosbenchError(f"pretrained={path} is a directory without config.json; valid: a directory written "
                            "by save_pretrained, or a .gguf file")
    torch_dtype = {"auto": torch.float32 if device.type == "cpu" else "auto", "fp32": torch.float32,
                   "bf16": torch.bfloat16}[dtype]
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(where, dtype=torch_dtype, local_files_only=True,
                                                                  **kwargs)
        tokenizer = transformers.AutoTokenizer.from_pretrained(where, local_files_only=True, **kwargs)
    except (OSError, ValueError, KeyError, ImportError, struct.error) as e:  # struct.error: a truncated .gguf
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PosbenchError(f"pretrained={path}: transformers cannot load it ({type(e).__name__}: {first})") from e
    backend, eos = _fast_tokenizer(tokenizer)
    name = source.stem if gguf else source.name
    return PretrainedLM(model.eval(), name, str(source)).to(device), backend, eos
