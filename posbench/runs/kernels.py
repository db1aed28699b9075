"""Environment variables that choose how posbench computes, validated before any work starts.

``POSBENCH_SDPA_BIAS`` orders the SDPA backends for attention with a float mask on CUDA
(:func:`posbench.model.attention.biased_sdpa`): ``auto`` (unset: torch's own order), ``cudnn``
(cuDNN's fused attention first, which takes an additive bias; pytorch PR 130482) or
``efficient`` (the memory-efficient kernel first). It changes the kernel, not what is computed,
so no config hash sees it; the bench measures each (``POSBENCH_SDPA_BIAS=cudnn posbench bench
--device cuda``). This module imports no torch: the command line checks it first
(:func:`check`), so a bad value stops a command before a run dir exists.
"""

from __future__ import annotations

import os

from ..errors import PosbenchError

#: the environment variables that choose kernels (POSBENCH_FLEX: posbench.model.attention); a bench
#: command and a run's ``execution`` name those that are set
KERNEL_SETTINGS = ("POSBENCH_FLEX", "POSBENCH_SDPA_BIAS")

#: POSBENCH_SDPA_BIAS -> SDPA backends tried first, in order (torch.nn.attention.SDPBackend names)
SDPA_BIAS_CHOICES = {"auto": (), "cudnn": ("CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"),
                     "efficient": ("EFFICIENT_ATTENTION", "MATH")}


def sdpa_bias_backends(value: str | None = None) -> tuple[str, ...]:
    """The backends ``POSBENCH_SDPA_BIAS`` (or ``value``) names; one line naming the choices for
    anything else."""
    value = os.environ.get("POSBENCH_SDPA_BIAS") if value is None else value
    if (value or "auto") not in SDPA_BIAS_CHOICES:
        raise PosbenchError(f"POSBENCH_SDPA_BIAS={value!r} is not valid; valid choices: "
                            f"{', '.join(SDPA_BIAS_CHOICES)}")
    return SDPA_BIAS_CHOICES[value or "auto"]


def check() -> None:
    """Every setting above, checked: PosbenchError for the first bad one."""
    sdpa_bias_backends()
