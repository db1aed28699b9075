"""The Python source files of pinned PyPI wheels as a corpus (``data.source=pypi``, ``data=pycode``).

Each wheel of ``data.packages`` is named by its file name and pinned by its SHA-256: it is
downloaded once with ``pip download`` (so a machine's own index settings apply) into
``<cache root>/wheels/``, checked against its hash, and read as a zip archive: nothing is
installed or imported. One document is one ``.py`` member. A package goes whole to the split its
entry names, so no package has files in two splits; documents are read split by split (train
first), package by package in the listed order, members in name order, and:

* a file shorter than ``data.min_doc_bytes`` is dropped (empty ``__init__.py`` files, stubs);
* a file whose bytes equal an earlier document's (SHA-256) is dropped, in any split, so a
  validation document never repeats a training one;
* a file that is not UTF-8 is dropped;
* with ``data.max_docs`` = N, each split keeps its first N documents (only the wheels those need
  are downloaded: a quick run fetches three);
* each split's documents are then shuffled by ``data.split.seed``, so any prefix of a split (the
  ladder's first tokens, ``data.train_tokens``) mixes its packages.

Validation and test documents shorter than ``data.eval_min_tokens`` tokens are dropped after
tokenizing (:func:`posbench.data.corpus.build_cache`), so every document scored can fill the
longest evaluation window. What was kept and dropped, per package, goes into the cache entry's
``manifest.json`` (:func:`manifest`).
"""

from __future__ import annotations

import email
import hashlib
import os
import random
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from ..config import WHEEL_SPLITS
from ..errors import PosbenchError


@dataclass
class Package:
    """One pinned wheel and what was read from it."""

    wheel: str
    sha256: str
    split: str
    license: str = ""
    kept: list[tuple[str, str]] = field(default_factory=list)  # (doc id, text)
    dropped: dict[str, int] = field(default_factory=lambda: {"small": 0, "duplicate": 0, "not_utf8": 0})

    @property
    def name(self) -> str:
        return self.wheel.split("-")[0]

    @property
    def version(self) -> str:
        return self.wheel.split("-")[1]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(pkg: Package, wheel_dir: Path, log=print) -> Path:
    """The pinned wheel at ``wheel_dir/<wheel>``: downloaded if absent, checked against its
    SHA-256 either way (a mismatch is removed and is an error, never read)."""
    path = wheel_dir / pkg.wheel
    if not path.is_file():
        wheel_dir.mkdir(parents=True, exist_ok=True)
        log(f"posbench: downloading {pkg.wheel} from PyPI")
        with tempfile.TemporaryDirectory(prefix=".download-", dir=wheel_dir) as tmp:
            # py3-none-any only, whatever this machine's Python or platform: the bytes are the pinned ones
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                   "--ignore-requires-python", "--platform", "any", "--implementation", "py", "--abi", "none",
                   "--python-version", "3", f"{pkg.name}=={pkg.version}", "--dest", tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            got = Path(tmp) / pkg.wheel
            if proc.returncode != 0 or not got.is_file():
                errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")] or proc.stderr.splitlines()
                why = errors[-1].removeprefix("ERROR: ") if errors else f"pip wrote no {pkg.wheel}"
                raise PosbenchError(f"could not download {pkg.name}=={pkg.version} from PyPI ({why}); offline, copy "
                                    f"{pkg.wheel} into {wheel_dir}, or a built corpus cache (data.cache_dir=)")
            os.replace(got, path)
    actual = sha256_file(path)
    if actual != pkg.sha256:
        path.unlink()
        raise PosbenchError(f"{path} has SHA-256 {actual}, not the pinned {pkg.sha256} (data.packages); "
                            "it was removed: re-run to download it again")
    return path


def wheel_license(archive: zipfile.ZipFile) -> str:
    """The licence a wheel's METADATA declares: License-Expression, else License, else classifiers."""
    name = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA")), None)
    if name is None:
        return ""
    meta = email.message_from_bytes(archive.read(name))
    declared = meta.get("License-Expression") or (meta.get("License") or "").strip().split("\n")[0]
    classifiers = [c.split(" :: ")[-1] for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    return declared or ", ".join(classifiers)


def read_package(pkg: Package, path: Path, min_bytes: int, seen: set[str], limit: int | None) -> None:
    """The kept ``.py`` members of ``pkg``'s wheel into ``pkg.kept`` (at most ``limit``), the
    dropped ones counted by reason; ``seen``: SHA-256 of every document kept so far."""
    with zipfile.ZipFile(path) as archive:
        pkg.license = wheel_license(archive)
        for info in sorted(archive.infolist(), key=lambda i: i.filename):
            if not info.filename.endswith(".py") or info.is_dir():
                continue
            if limit is not None and len(pkg.kept) >= limit:
                return
            raw = archive.read(info)
            digest = hashlib.sha256(raw).hexdigest()
            if len(raw) < min_bytes:
                pkg.dropped["small"] += 1
            elif digest in seen:
                pkg.dropped["duplicate"] += 1
            else:
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    pkg.dropped["not_utf8"] += 1
                    continue
                seen.add(digest)
                pkg.kept.append((f"{pkg.name}-{pkg.version}:{info.filename}", text))


def packages(cfg) -> list[Package]:
    """``data.packages`` in split order (train, validation, test), each split's in listed order."""
    listed = [Package(str(p["wheel"]), str(p["sha256"]), str(p["split"])) for p in cfg.packages]
    return [p for split in WHEEL_SPLITS for p in listed if p.split == split]


def read_documents(cfg, wheel_dir: Path, log=print) -> tuple[dict[str, list[tuple[str, str]]], list[Package]]:
    """split -> [(doc id, text)] shuffled by ``data.split.seed``, and the packages read (a package
    a ``data.max_docs`` slice did not reach is left out)."""
    seen: set[str] = set()
    docs: dict[str, list[tuple[str, str]]] = {s: [] for s in WHEEL_SPLITS}
    read = []
    for pkg in packages(cfg):
        room = None if cfg.max_docs is None else int(cfg.max_docs) - len(docs[pkg.split])
        if room is not None and room <= 0:
            continue
        read_package(pkg, fetch_wheel(pkg, wheel_dir, log), int(cfg.min_doc_bytes), seen, room)
        docs[pkg.split] += pkg.kept
        read.append(pkg)
    seed = int(dict(cfg.split).get("seed", 0))
    for split, kept in docs.items():
        if not kept:
            raise PosbenchError(f"data={cfg.name}: the {split} split has no documents (every file of its packages "
                                "was dropped: shorter than data.min_doc_bytes, a duplicate, or not UTF-8)")
        random.Random(f"{seed}:{split}").shuffle(kept)
    return docs, read


def quantiles(lengths: list[int]) -> dict[str, int]:
    """Document lengths (tokens) at a few quantiles, nearest rank."""
    if not lengths:
        return {}
    ordered = sorted(lengths)
    at = {"min": 0.0, "p10": 0.1, "p25": 0.25, "p50": 0.5, "p75": 0.75, "p90": 0.9, "max": 1.0}
    return {k: ordered[min(len(ordered) - 1, int(q * len(ordered)))] for k, q in at.items()}


def wheel_cache(root: Path) -> Path:
    """Where the wheels are kept: beside the corpus entries, shared by every entry."""
    return root / "wheels"


def encode(tok, docs: list[tuple[str, str]], chunk: int = 256):
    """(doc id, token ids) for each document, in order; encoded ``chunk`` documents at a time
    (in parallel, without the offsets a whole corpus's encodings would hold in memory)."""
    batch = getattr(tok, "encode_batch_fast", tok.encode_batch)  # the same ids, no offsets (tokenizers >= 0.20)
    for start in range(0, len(docs), chunk):
        part = docs[start:start + chunk]
        for (doc_id, _), enc in zip(part, batch([text for _, text in part])):
            yield doc_id, enc.ids


LONG = (1024, 2048, 4096, 8192)  # the manifest counts each split's documents at least this many tokens long


def manifest(cfg, read: list[Package], docs, lengths: dict[str, dict[str, int]], arrays, separators: int) -> dict:
    """What the entry holds and where it came from: the settings, each wheel (version, hash,
    licence, documents and tokens kept, files dropped and why) and each split (documents, tokens,
    bytes, document lengths in tokens). ``lengths``: split -> doc id -> tokens of the documents
    kept; ``separators``: tokens added after each document (1 with data.doc_separator=eos)."""
    by_package: dict[str, dict[str, int]] = {}
    for split, kept in lengths.items():
        for doc_id, n in kept.items():
            entry = by_package.setdefault(doc_id.split(":", 1)[0], {"documents": 0, "tokens": 0})
            entry["documents"] += 1
            entry["tokens"] += n + separators
    text = {doc_id: t for split in docs.values() for doc_id, t in split}
    packages_out = []
    for pkg in read:
        own = by_package.get(f"{pkg.name}-{pkg.version}", {"documents": 0, "tokens": 0})
        short = len(pkg.kept) - own["documents"]  # validation and test: under data.eval_min_tokens
        packages_out.append({"name": pkg.name, "version": pkg.version, "wheel": pkg.wheel, "sha256": pkg.sha256,
                             "split": pkg.split, "license": pkg.license, **own,
                             "bytes": sum(len(text[d].encode()) for d, _ in pkg.kept if d in lengths[pkg.split]),
                             "dropped": {**pkg.dropped, "short": short}})
    splits = {}
    for split, kept in lengths.items():
        splits[split] = {"documents": len(kept), "tokens": int(arrays[split].size),
                         "bytes": sum(len(text[d].encode()) for d in kept),
                         "doc_tokens": quantiles(list(kept.values())),
                         "documents_at_least": {str(n): sum(v >= n for v in kept.values()) for n in LONG}}
        largest = max((p for p in packages_out if p["split"] == split), key=lambda p: p["tokens"])
        splits[split]["largest_package"] = {"name": largest["name"],
                                            "share": round(largest["tokens"] / max(1, arrays[split].size), 4)}
    return {"source": "pypi", "name": cfg.name, "dtype": str(arrays["train"].dtype), "packages": packages_out,
            "splits": splits, "settings": {"min_doc_bytes": int(cfg.min_doc_bytes),
                                           "eval_min_tokens": int(cfg.eval_min_tokens), "max_docs": cfg.max_docs,
                                           "split_seed": int(dict(cfg.split).get("seed", 0)),
                                           "doc_separator": cfg.doc_separator}}
