"""data=pycode (the Python files of pinned PyPI wheels, conf/data/pycode.md), its compact cache
and the once-a-pass sampler (train.sampler=once)."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import posbench.data.pypi
from conftest import compose
from posbench.config import DataConfig, TrainConfig, config_hash, typed
from posbench.data.corpus import (MANIFEST, Corpus, first_block_sha256, load_corpus, read_cache, train_tokenizer,
                                  write_entry)
from posbench.data.prepare import prepare
from posbench.data.windows import OnceSampler, WindowSampler
from posbench.errors import PosbenchError
from posbench.train.loop import Prefetcher


def pycode(*overrides) -> DataConfig:
    return typed(DataConfig, compose("data=pycode", *overrides).data, "data")


# ---------------------------------------------------------------- the sampler
def test_once_sampler_reads_each_window_at_most_once_a_pass():
    tokens = np.arange(1001, dtype=np.uint16)  # 100 windows of 10 tokens (+1 target)
    sampler = OnceSampler(tokens, train_len=10, batch_size=7, seed=0, steps=14)
    assert sampler.windows == 100
    starts = []
    for _ in range(14):  # 98 of the 100 windows
        x, y, positions = sampler()
        assert x.dtype == torch.int64 and x.shape == (7, 10) and positions is None
        assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)  # ids are positions here
        starts += x[:, 0].tolist()
    assert len(set(starts)) == 98 and all(s % 10 == 0 for s in starts)  # distinct, non-overlapping windows
    x, _, _ = sampler()  # the 15th batch: the last 2 windows of the pass, then 5 of the next pass's order
    assert sorted(set(range(0, 1000, 10)) - set(starts)) == sorted(x[:2, 0].tolist())
    assert len(set(x[2:, 0].tolist())) == 5
    other = OnceSampler(tokens, train_len=10, batch_size=7, seed=1)
    assert not torch.equal(other()[0], OnceSampler(tokens, 10, 7, seed=0)()[0])  # the seed picks the order


def test_once_sampler_refuses_a_budget_over_one_pass():
    tokens = np.arange(1001, dtype=np.uint16)
    OnceSampler(tokens, train_len=10, batch_size=10, seed=0, steps=10)  # exactly one pass
    with pytest.raises(PosbenchError, match=r"^train.sampler=once: train.steps=11 x train.batch_size=10 = 110 windows, "
                                            r"but the training split has 100 windows of 10 tokens \(1,001 tokens\), "
                                            r"one pass; valid: train.steps <= 10 at this batch size, or "
                                            r"train.sampler=random"):
        OnceSampler(tokens, train_len=10, batch_size=10, seed=0, steps=11)


@pytest.mark.parametrize("random_positions", [None, 64])
def test_once_sampler_resumes_where_its_checkpoint_left_off(random_positions):
    """The trainer saves the state after the last batch handed out (the Prefetcher draws one
    ahead) and restores it into a fresh sampler: the batches go on as if never stopped."""
    tokens = np.random.default_rng(0).integers(0, 65536, 5001).astype(np.uint16)
    make = lambda: OnceSampler(tokens, train_len=16, batch_size=4, seed=3, random_positions=random_positions)  # noqa: E731
    one = make()
    straight = [one() for _ in range(8)]
    batches = Prefetcher(make())
    first = [batches() for _ in range(5)]
    state = batches.consumed_state
    batches.close()
    assert state.tolist() == [5]
    resumed = make()
    resumed.generator.set_state(state)
    for a, b in zip(straight, first + [resumed() for _ in range(3)]):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert (a[2] is None and b[2] is None) or torch.equal(a[2], b[2])
    with pytest.raises(PosbenchError, match="not that of train.sampler=once"):
        make().generator.set_state(torch.Generator().get_state())


def test_window_sampler_batches_do_not_depend_on_the_dtype():
    """The random sampler indexes the array in its own dtype (uint16 for pycode): the same
    batches as the int64 copy it used to make."""
    ids = np.random.default_rng(1).integers(0, 60000, 3000)
    a, b = WindowSampler(ids.astype(np.uint16), 32, 8, seed=5), WindowSampler(ids.astype(np.int32), 32, 8, seed=5)
    generator, table = torch.Generator().manual_seed(5), torch.from_numpy(ids.astype(np.int64))
    for _ in range(3):
        starts = torch.randint(0, 3000 - 33 + 1, (8,), generator=generator)
        reference = table[starts[:, None] + torch.arange(33)[None, :]]
        for x, y, _ in (a(), b()):
            assert torch.equal(x, reference[:, :-1]) and torch.equal(y, reference[:, 1:])


def test_sampler_key_is_hashed_only_when_set():
    base = config_hash(compose())
    assert config_hash(compose("train.sampler=random")) == base
    assert config_hash(compose("train.sampler=once")) != base
    assert config_hash(compose("data=pycode")) != base
    with pytest.raises(PosbenchError, match=r"^train.sampler='twice' is not valid; valid choices: random, once$"):
        typed(TrainConfig, compose("train.sampler=twice").train, "train")


# ---------------------------------------------------------------- the config
def test_a_bad_source_or_package_is_one_line():
    node = OmegaConf.to_container(compose("data=pycode").data)
    with pytest.raises(PosbenchError, match=r"^data.source='pip' is not valid; valid choices: sotu, text, hub, pypi$"):
        typed(DataConfig, {**node, "source": "pip"}, "data")
    cases = {"split": ({"split": "dev"}, r"^data.packages\[0\].split='dev' is not valid; valid choices: train, "
                                         r"validation, test$"),
             "sha256": ({"sha256": "abc"}, r"^data.packages\[0\].sha256='abc' is not valid; valid: 64 lowercase hex"),
             "wheel": ({"wheel": "sympy.tar.gz"}, r"^data.packages\[0\].wheel='sympy.tar.gz' is not a wheel's file")}
    for change, message in cases.values():
        packages = [{**node["packages"][0], **change}, *node["packages"][1:]]
        with pytest.raises(PosbenchError, match=message):
            typed(DataConfig, {**node, "packages": packages}, "data")
    no_test = [p for p in node["packages"] if p["split"] != "test"]
    with pytest.raises(PosbenchError, match=r"^data.packages gives no wheel to the test split"):
        typed(DataConfig, {**node, "packages": no_test}, "data")
    with pytest.raises(PosbenchError, match=r"^data.min_doc_bytes is read by data.source=pypi only"):
        typed(DataConfig, {**OmegaConf.to_container(compose().data), "min_doc_bytes": 10}, "data")


def test_a_wheel_that_does_not_match_its_pin_is_removed_not_read(tmp_path):
    pkg = posbench.data.pypi.Package("sympy-1.14.0-py3-none-any.whl", "0" * 64, "train")
    (tmp_path / pkg.wheel).write_bytes(b"not the pinned wheel")
    with pytest.raises(PosbenchError, match=r"has SHA-256 [0-9a-f]{64}, not the pinned 0{64} \(data.packages\)"):
        posbench.data.pypi.fetch_wheel(pkg, tmp_path)
    assert not (tmp_path / pkg.wheel).exists()


# ---------------------------------------------------------------- the cache
def test_uint16_entry_round_trips_and_its_fingerprint_is_its_manifests(tmp_path):
    tok = train_tokenizer(["def f(x):\n    return x\n"] * 20, 300, 2)
    arrays = {"train": np.array([0, 1, 65535, 40000] * 600, np.uint16), "validation": np.arange(10, dtype=np.uint16),
              "test": np.arange(5, dtype=np.uint16)}
    final = tmp_path / "toy-0123456789abcdef"
    write_entry(final, tok, arrays, {"name": "toy", "key": "0123456789abcdef"}, {"packages": [], "splits": {}})
    corpus = read_cache(final)
    for split, ids in arrays.items():
        assert corpus.splits[split].dtype == np.uint16 and np.array_equal(corpus.splits[split], ids)
    manifest = (final / MANIFEST).read_bytes()
    assert corpus.meta["fingerprint"] == hashlib.sha256(manifest).hexdigest()[:16]
    assert corpus.meta["manifest"]["first_block_sha256"] == first_block_sha256(arrays["train"])
    assert corpus.meta["manifest"]["files"]["train.npy"] == hashlib.sha256((final / "train.npy").read_bytes()).hexdigest()
    (final / MANIFEST).write_bytes(manifest.replace(b'"packages": []', b'"packages": [1]'))  # edited: not used
    messages = []
    assert read_cache(final, log=messages.append) is None and "manifest.json does not match" in messages[0]


def test_first_block_hash_does_not_depend_on_the_dtype():
    ids = np.arange(3000) % 60000
    assert first_block_sha256(ids.astype(np.uint16)) == first_block_sha256(ids.astype(np.int64))


# ---------------------------------------------------------------- the real corpus
# A slice (data=pycode data.max_docs=24 data.vocab_size=1024, experiment=smoke's corpus): three wheels
# (transformers, networkx, nltk, 17 MB) from PyPI, a few seconds to build.
SLICE = {"train": 293_130, "validation": 51_749, "test": 183_685}
SLICE_FIRST_BLOCK = "479bea1f284fe63cc5886df9a5612ef27fc562ceefb47afa093b4cc9322aa790"


def test_pycode_slice_is_built_from_pypi_and_pins_its_counts(tmp_path, monkeypatch):
    cfg = pycode("data.max_docs=24", "data.vocab_size=1024")
    corpus = load_corpus(cfg, cache_dir=tmp_path)
    assert {s: int(a.size) for s, a in corpus.splits.items()} == SLICE
    assert all(a.dtype == np.uint16 for a in corpus.splits.values())
    manifest = corpus.meta["manifest"]
    assert manifest["first_block_sha256"] == SLICE_FIRST_BLOCK == first_block_sha256(corpus.splits["train"])
    assert [(p["name"], p["split"], p["documents"]) for p in manifest["packages"]] == [
        ("transformers", "train", 24), ("networkx", "validation", 12), ("nltk", "test", 19)]
    for split in ("validation", "test"):  # every document scored fills a 2,048-token window
        assert manifest["splits"][split]["doc_tokens"]["min"] >= 2048
    # data.train_tokens: an entry of its own, derived from this one, copied alone, used where no wheel is
    slice_ = ("data.max_docs=24", "data.vocab_size=1024", "data.train_tokens=100000")
    elsewhere = tmp_path / "elsewhere"
    entry = prepare(pycode(*slice_, f"data.cache_dir={tmp_path}"), copy_to=str(elsewhere), log=lambda m: None)
    assert sorted(p.name for p in elsewhere.iterdir()) == [entry.name]
    small = load_corpus(pycode(*slice_), cache_dir=tmp_path)
    assert np.array_equal(small.splits["train"], corpus.splits["train"][:100_000])
    assert np.array_equal(small.splits["validation"], corpus.splits["validation"])
    assert small.meta["manifest"]["train_tokens"] == {"tokens": 100_000, "of": SLICE["train"],
                                                      "prefix_of": corpus.meta["fingerprint"]}
    monkeypatch.setattr(posbench.data.pypi, "fetch_wheel", lambda *a, **k: pytest.fail("a wheel was fetched"))
    copied = load_corpus(pycode(*slice_, f"data.cache_dir={elsewhere}"), log=lambda m: pytest.fail(m))
    assert copied.meta["fingerprint"] == small.meta["fingerprint"] and copied.splits["train"].size == 100_000
    # --pack-to: the same entry as one compact file, unpacked where it is found, byte for byte
    packed = tmp_path / "packed"
    prepare(pycode(*slice_, f"data.cache_dir={tmp_path}"), log=lambda m: None, pack_to=str(packed))
    assert sorted(p.name for p in packed.iterdir()) == [f"{entry.name}.carry"]
    messages = []
    unpacked = load_corpus(pycode(*slice_, f"data.cache_dir={packed}"), log=messages.append)
    assert messages == [f"posbench: unpacking corpus 'pycode' from {packed / entry.name}.carry"]
    assert unpacked.meta["fingerprint"] == small.meta["fingerprint"]
    assert all(np.array_equal(unpacked.splits[s], small.splits[s]) for s in small.splits)
    assert all((packed / entry.name / f.name).read_bytes() == f.read_bytes() for f in entry.iterdir())
    assert (packed / f"{entry.name}.carry").stat().st_size < 0.5 * sum(f.stat().st_size for f in entry.iterdir())
    with pytest.raises(PosbenchError, match=r"^data.train_tokens=300000 is more than the 293130 tokens"):
        load_corpus(pycode("data.max_docs=24", "data.vocab_size=1024", "data.train_tokens=300000"), cache_dir=tmp_path)


# The full corpus (conf/data/pycode.md): built by `posbench train data=pycode ...` into the default
# cache (~/.cache/posbench), several minutes on 2 cores; checked where it has been built.
FULL = {"train": 66_180_938, "validation": 2_876_795, "test": 2_820_919}
FULL_FIRST_BLOCK = "67da1261d750053a923fe6d9f7892615f35989c97c5394f3b1596be9d44ab1c1"


def full_entry() -> Path | None:
    from posbench.data.corpus import cache_key

    entry = Path.home() / ".cache" / "posbench" / f"pycode-{cache_key(pycode())}"
    return entry if (entry / "meta.json").is_file() else None


@pytest.mark.skipif(full_entry() is None, reason="the full pycode corpus is not in ~/.cache/posbench")
def test_full_pycode_corpus_pins_its_counts():
    corpus: Corpus = read_cache(full_entry())
    manifest = corpus.meta["manifest"]
    assert {s: int(a.size) for s, a in corpus.splits.items()} == FULL
    assert manifest["first_block_sha256"] == FULL_FIRST_BLOCK
    assert FULL["train"] >= 50_000_000
    train = [p for p in manifest["packages"] if p["split"] == "train"]
    assert max(p["tokens"] for p in train) < FULL["train"] / 3  # no project over a third of the training tokens
    assert manifest["splits"]["validation"]["documents_at_least"]["2048"] == manifest["splits"]["validation"]["documents"]
    assert json.loads(json.dumps(manifest))["dtype"] == "uint16"
