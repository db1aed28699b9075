"""``posbench.testing``: the documented import of the conformance checks a plugin author runs.

The checks live in the model stage (:mod:`posbench.model.conformance`); this module re-exports
them so that ``from posbench.testing import check_encoding`` keeps working.
"""

from .model.conformance import *  # noqa: F401,F403
from .model.conformance import CHECKS, ConformanceError, check_encoding, resolve  # noqa: F401
