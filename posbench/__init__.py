"""posbench: train short, test long. A benchmark for length extrapolation of position encodings."""

__version__ = "0.1.0"
