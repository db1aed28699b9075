"""The model stage: the language model every encoding trains in, and what runs it.

==================  ==========================================================================
transformer         :class:`LanguageModel`, the decoder-only LM (embeddings, blocks, the head)
attention           the causal attention kernels; each chooses the fastest one an encoding's
                    hooks allow
loss                the fused next-token cross-entropy that never makes the logits
length_scaling      logit scaling by the keys a query sees (log-n, SSMax)
build               run config -> model; device, dtype and autocast
preflight           a model's memory before it runs (training, evaluation, pretrained)
pretrained          Hugging Face models behind the same interface as posbench's own
conformance         the checks every encoding, built-in or plugin, passes
                    (re-exported as :mod:`posbench.testing`, the documented import)
==================  ==========================================================================

The position encodings themselves are the other half of this stage (:mod:`posbench.encodings`),
with the training-free extensions that act on them at evaluation
(:mod:`posbench.encodings.extension`): an extension rewrites what an encoding does past its
training length, so it lives beside the encodings rather than beside the model.

The folder is named for the stage, so ``posbench.model`` is a package; ``from posbench.model
import LanguageModel`` still works through the lazy attribute below, without importing
the whole model whenever one of this stage's modules is imported on its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def __getattr__(name: str) -> Any:
    """``posbench.model.X`` for the names of :mod:`.transformer` (``LanguageModel``, ...); a
    submodule's name is left to the import system, so ``from posbench.model import preflight``
    imports that module alone."""
    if name.startswith("__") or (Path(__file__).parent / f"{name}.py").exists():
        raise AttributeError(f"module 'posbench.model' has no attribute {name!r}")
    from . import transformer

    try:
        return getattr(transformer, name)
    except AttributeError:
        raise AttributeError(f"module 'posbench.model' has no attribute {name!r}") from None
