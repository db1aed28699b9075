"""The packaged corpus, its deterministic split, the cached tokenizer, and bad text input."""

import time

import numpy as np
import pytest
from omegaconf import OmegaConf

from posbench.data import load_corpus, load_documents, sotu_files, split_documents
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


def test_corpus_cache_is_reused(tmp_path):
    cfg = data_cfg()
    first = load_corpus(cfg, cache_dir=tmp_path)
    assert first.vocab_size == 600
    assert set(first.splits) == {"train", "validation", "test"}
    assert first.splits["train"].size > 5 * first.splits["validation"].size > 0  # 16 vs 2 documents
    (cache,) = tmp_path.iterdir()
    stamp = (cache / "tokenizer.json").stat().st_mtime_ns
    messages = []
    t = time.perf_counter()
    second = load_corpus(cfg, cache_dir=tmp_path, log=messages.append)
    assert messages == [] and time.perf_counter() - t < 2
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
