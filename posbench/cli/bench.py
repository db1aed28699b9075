"""``posbench bench``: speed and memory of every encoding beside a peer; :mod:`posbench.bench` runs it."""

HELP = "training and evaluation speed and memory of every encoding, beside x-transformers"


def main(args: list[str]) -> None:
    from ..bench import main as bench

    bench(args)
