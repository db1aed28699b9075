"""Build a corpus's cache entry without training, and copy it where another machine can use it.

    python -m posbench.data.prepare data=pycode                       # the full entry (~/.cache/posbench)
    python -m posbench.data.prepare data=pycode data.train_tokens=18000000 --copy-to carry
    # then, on a machine without the wheels or a network (carry/ copied there, 48.5 MB):
    posbench train data=pycode data.train_tokens=18000000 data.cache_dir=carry ...
    python -m posbench.data.prepare data=pycode data.train_tokens=18000000 --pack-to carry
    # the same entry as one compact carry/pycode-KEY.carry, unpacked there on first use

The overrides are ``posbench train``'s (``data=``, ``data.*``, ``experiment=``); only the data
section is read. It prints the entry's folder, size and fingerprint. ``--copy-to DIR`` copies
that one folder into DIR (no wheels, no other entry): what ``data.cache_dir=DIR`` finds there is
the same entry, by the same key, so the run's config hash and corpus key are those of the
machine that built it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from ..config import DataConfig, conf_dir, default_cache_dir, typed
from ..errors import PosbenchError
from .carry import pack
from .corpus import cache_key, load_corpus


def data_config(overrides: list[str]) -> DataConfig:
    """The ``data`` section ``posbench train <overrides>`` would see."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = compose(config_name="app_train", overrides=overrides)
    return typed(DataConfig, cfg.data, "data")


def prepare(cfg: DataConfig, copy_to: str | None = None, log=print, pack_to: str | None = None) -> Path:
    """Build or reuse ``cfg``'s entry; with ``copy_to``, copy it (alone) into that folder; with
    ``pack_to``, write it there as one compact ``.carry`` file (:mod:`posbench.data.carry`). -> the entry."""
    corpus = load_corpus(cfg, log=log)
    entry = Path(cfg.cache_dir or default_cache_dir()).expanduser() / f"{cfg.name}-{cache_key(cfg)}"
    if pack_to is not None:
        packed = pack(entry, Path(pack_to).expanduser())
        size = sum(f.stat().st_size for f in entry.iterdir())
        log(f"posbench: packed corpus {cfg.name!r} into {packed}: {packed.stat().st_size / 1e6:.1f} MB "
            f"({size / 1e6:.1f} MB as an entry)")
    if copy_to is not None:
        target = Path(copy_to).expanduser() / entry.name
        if not target.exists():
            staging = target.parent / f".{entry.name}-copy"
            shutil.rmtree(staging, ignore_errors=True)
            shutil.copytree(entry, staging)
            staging.rename(target)  # whole, or not there
        entry = target
    size = sum(f.stat().st_size for f in entry.iterdir())
    tokens = ", ".join(f"{s} {a.size:,}" for s, a in corpus.splits.items())
    fingerprint = corpus.meta.get("fingerprint", "none (no manifest)")
    log(f"posbench: corpus {cfg.name!r} at {entry}: {size / 1e6:.1f} MB, tokens {tokens}, fingerprint {fingerprint}")
    return entry


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m posbench.data.prepare", description=__doc__.split("\n")[0])
    parser.add_argument("overrides", nargs="*", help="posbench train's overrides, e.g. data=pycode data.train_tokens=N")
    parser.add_argument("--copy-to", metavar="DIR",
                        help="copy the entry alone into DIR (use it with data.cache_dir=DIR)")
    parser.add_argument("--pack-to", metavar="DIR",
                        help="write the entry into DIR as one compact NAME-KEY.carry file, unpacked on first use "
                             "with data.cache_dir=DIR")
    args = parser.parse_args(argv)
    from hydra.errors import HydraException

    try:
        prepare(data_config(args.overrides), args.copy_to, pack_to=args.pack_to)
    except (PosbenchError, HydraException) as e:  # a bad value, an unknown preset: one line
        print(f"posbench: error: {str(e).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
