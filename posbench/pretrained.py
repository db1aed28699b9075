"""Pretrained causal language models (Hugging Face transformers) on posbench's ladder and probes.

``posbench eval pretrained=PATH`` measures a model trained elsewhere with the same protocols as
posbench's own runs: every length scores the same tokens, sliding windows, bits per byte,
per-position loss, token NLL for paired intervals, probes. PATH is a local model directory
(config, weights and tokenizer, as ``save_pretrained`` writes them) or a ``.gguf`` file
(transformers reads GGUF with ``gguf_file=``; the ``gguf`` package). Nothing is downloaded:
hub names are refused with one line.

:class:`PretrainedLM` wraps the transformers model in the interface the ladder and the probes
use for posbench's :class:`~posbench.model.LanguageModel`: ``hidden(ids, positions)``,
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

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .encodings import PositionRangeError
from .errors import PosbenchError

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

    @property
    def dims(self):
        return self


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

    def head_nll(self, hidden: torch.Tensor, targets: torch.Tensor, rows: int = 2048) -> torch.Tensor:
        """NLL of ``targets`` (...,) in fp32, the logits made ``rows`` tokens at a time."""
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
    if not gguf and not (source / "config.json").is_file():
        raise PosbenchError(f"pretrained={path} holds no config.json; valid: a directory written by "
                            "save_pretrained, or a .gguf file")
    torch_dtype = {"auto": torch.float32 if device.type == "cpu" else "auto", "fp32": torch.float32,
                   "bf16": torch.bfloat16}[dtype]
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(where, dtype=torch_dtype, local_files_only=True,
                                                                  **kwargs)
        tokenizer = transformers.AutoTokenizer.from_pretrained(where, local_files_only=True, **kwargs)
    except (OSError, ValueError, KeyError, ImportError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PosbenchError(f"pretrained={path}: transformers cannot load it ({type(e).__name__}: {first})") from e
    backend, eos = _fast_tokenizer(tokenizer)
    name = source.stem if gguf else source.name
    return PretrainedLM(model.eval(), name, str(source)).to(device), backend, eos
