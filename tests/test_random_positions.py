"""Randomized positions (Ruoss et al. 2023; posbench/data/positions.py and
posbench/encodings/randomized.py): the sampler, every encoding and
kernel under sorted positions with gaps, and the ordinary path (0 .. T-1) left as it was."""

import pytest
import torch
from conftest import compose, tiny_model

import posbench.model.attention as attention
import posbench.model.transformer as model_module
from posbench.model.attention import reference_attention
from posbench.model.build import encoding_options
from posbench.config import TrainConfig, config_hash, hashed_part
from posbench.data.positions import random_positions
from posbench.encodings import REGISTRY
from posbench.encodings.randomized import check_random_positions
from posbench.errors import PosbenchError

T, L = 40, 200  # window longer than the chunk below; positions drawn from [0, L)
READERS = sorted(name for name, cls in REGISTRY.items() if cls.reads_positions)
# depend on i - j only: their output is the same for positions shifted by a constant
TRANSLATION_INVARIANT = sorted([n for n, c in REGISTRY.items() if c.relative_bias]
                               + ["rope", "xpos", "shaw", "xl", "deberta", "tener"])


def perturbed_model(name, chunk, **params):
    """conftest's tiny model with 2 layers and its encoding parameters moved away from their init
    (so every term counts: CoPE's table starts at zeros); position tables hold L entries."""
    if "max_len" in REGISTRY[name].params():
        params = {"max_len": L, **params}
    model = tiny_model(name, params, vocab=64, train_len=16, n_layers=2, attn_chunk=chunk)
    with torch.no_grad():
        for p in model.encoding.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def tokens():
    return torch.randint(0, 64, (2, T), generator=torch.Generator().manual_seed(1))


def gapped():
    return random_positions(T, L, torch.Generator().manual_seed(2))


# ---- the sampler --------------------------------------------------------------------------

def test_random_positions_are_a_sorted_subset_drawn_by_the_generator():
    g = torch.Generator().manual_seed(0)
    first, second = random_positions(50, 1000, g), random_positions(50, 1000, g)
    for pos in (first, second):
        assert pos.dtype == torch.long and pos.shape == (50,)
        assert (pos[1:] > pos[:-1]).all() and pos.min() >= 0 and pos.max() < 1000  # sorted, distinct, in range
    assert not torch.equal(first, second)  # the generator advanced
    assert torch.equal(random_positions(50, 1000, torch.Generator().manual_seed(0)), first)  # same state, same draw
    assert torch.equal(random_positions(7, 7, g), torch.arange(7))  # every position once


def test_random_positions_refuse_more_positions_than_the_range():
    with pytest.raises(PosbenchError, match=r"^cannot draw 9 distinct positions from \[0, 8\); valid: 1 <= length <= 8"):
        random_positions(9, 8, torch.Generator())


@pytest.mark.parametrize("positions, match", [(torch.arange(T - 1), r"shape \(40,\)"),
                                              (torch.arange(T).float(), "integer tensor"),
                                              (torch.arange(T).flip(0), "strictly increasing"),
                                              (torch.zeros(T, dtype=torch.long), "strictly increasing"),
                                              (torch.arange(T) - 1, ">= 0")])
def test_the_model_refuses_positions_out_of_order(positions, match):
    with pytest.raises(PosbenchError, match=match):
        perturbed_model("alibi", 8)(tokens(), positions=positions)


# ---- every encoding under positions with gaps ---------------------------------------------

@pytest.mark.parametrize("name, params", [(n, {}) for n in READERS] + [("t5", {"per_layer": True})])
def test_chunked_kernels_with_gapped_positions_equal_one_chunk(name, params):
    """Query chunks of 8 (per-chunk biases, explicit chunks) == one chunk of all 40 queries, by SDPA
    and by the explicit training kernel: nothing assumes consecutive positions."""
    x, pos = tokens(), gapped()
    with torch.no_grad():
        chunked = perturbed_model(name, 8, **params)(x, positions=pos)
        single = perturbed_model(name, 64, **params)(x, positions=pos)
    explicit = perturbed_model(name, 64, **params)(x, positions=pos)  # grad on, T <= EXPLICIT_MAX_LEN
    torch.testing.assert_close(chunked, single, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(explicit.detach(), single, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", TRANSLATION_INVARIANT)
def test_relative_encodings_see_distances_only(name):
    """Shifting every position by 100 (consecutive: Toeplitz slices) changes nothing; spreading
    them to 0, 2, 4, .. (per-chunk path) doubles every distance and changes the output."""
    model, x = perturbed_model(name, 8), tokens()
    with torch.no_grad():
        ordinary = model(x)
        shifted = model(x, positions=torch.arange(T) + 100)
        spread = model(x, positions=2 * torch.arange(T))
    torch.testing.assert_close(shifted, ordinary, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(spread, ordinary, atol=1e-5)


def test_sandwich_bias_at_gapped_positions_matches_its_formula():
    """Distances past the number of keys (gaps) are in the distance table (by_distance)."""
    enc = perturbed_model("sandwich", 8).encoding
    q_pos, k_pos = torch.tensor([5, 90, 150]), torch.tensor([0, 5, 90, 150])
    w = 10000.0 ** (-2.0 * torch.arange(1, enc.dim // 2 + 1) / enc.dim)
    distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0).float()  # (Tq, Tk); the future is masked anyway
    dot = torch.cos(distance[..., None] * w).sum(-1) - enc.dim / 2  # sum_k cos((i - j) w_k) - d'/2
    heads = torch.arange(1, 5).float()
    torch.testing.assert_close(enc.bias(q_pos, k_pos, 0), dot[None] / (8 * heads / 4)[:, None, None])


# ---- the ordinary path --------------------------------------------------------------------

def reference_forward(model, x, positions):
    """The model with every layer's attention replaced by plain fp32 attention."""
    def plain(q, k, v, enc, pos, layer, chunk_size=1024, cache=None, decay=None, window=0, transition=None, sink=None):
        return reference_attention(q, k, v, enc, pos, layer, decay, window, transition, sink)

    original = model_module.causal_attention
    model_module.causal_attention = plain
    try:
        return model(x, positions=positions)
    finally:
        model_module.causal_attention = original


@pytest.mark.parametrize("name", sorted(n for n, c in REGISTRY.items() if c.relative_bias and c.layer_invariant_bias))
def test_consecutive_positions_take_the_toeplitz_slices_and_gapped_ones_do_not(name, monkeypatch):
    calls = []
    toeplitz = attention._toeplitz
    monkeypatch.setattr(attention, "_toeplitz", lambda *a: calls.append(1) or toeplitz(*a))
    model, x = perturbed_model(name, 8), tokens()
    with torch.no_grad():
        for positions, used in ((None, True), (torch.arange(T), True), (gapped(), False)):
            calls.clear()
            out = model(x, positions=positions)
            assert bool(calls) == used
            ref = reference_forward(model, x, positions)
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


# ---- config and the checks the trainer calls ----------------------------------------------

def test_train_random_positions_must_cover_the_training_window():
    assert TrainConfig(random_positions=None).random_positions is None
    assert TrainConfig(train_len=128, random_positions=128).random_positions == 128
    with pytest.raises(PosbenchError, match=r"^train.random_positions=64 is shorter than train.train_len=128; "
                                            r"valid: null \(positions 0..T-1\) or an integer >= 128$"):
        TrainConfig(train_len=128, random_positions=64)


@pytest.mark.parametrize("key", ["random_positions", "pose_target"])
def test_a_null_position_option_keeps_the_config_hash_of_runs_made_before_it(key):
    """train.random_positions and train.pose_target (PoSE) are hashed only when set."""
    from omegaconf import OmegaConf

    cfg = compose()
    assert cfg.train[key] is None
    data = OmegaConf.to_container(cfg, resolve=True)
    before = {**data, "train": {k: v for k, v in data["train"].items() if k != key}}
    assert hashed_part(before) == hashed_part(data)
    assert config_hash(compose(f"train.{key}=2048")) != config_hash(cfg)


def test_check_random_positions_names_what_is_wrong():
    check_random_positions("alibi", None, 10 ** 6)  # null: nothing to check
    check_random_positions(REGISTRY["rope"], 2048, 2048)
    valid = ", ".join(READERS)
    with pytest.raises(PosbenchError, match=r"^train.random_positions=2048 has no effect on encoding=nope, which reads "
                                            rf"no positions; valid: encodings that read positions: {valid}$"):
        check_random_positions("nope", 2048, 128)
    with pytest.raises(PosbenchError, match=r"^train.random_positions=1024 cannot give a window of 2048 tokens "
                                            r"distinct positions; valid: train.random_positions >= 2048"):
        check_random_positions("alibi", 1024, 2048)
    with pytest.raises(PosbenchError, match=r"^eval.rope_scaling=pi does not combine with train.random_positions"):
        check_random_positions("rope", 2048, 1024, rope_scaling="pi")
    with pytest.raises(PosbenchError, match="unknown encoding 'bogus'"):
        check_random_positions("bogus", 2048, 128)


def test_position_tables_are_sized_for_random_positions():
    assert encoding_options(compose("encoding=learned", "train.train_len=64"))["max_len"] == 64  # as before
    assert encoding_options(compose("encoding=learned", "encoding.max_len=null", "train.random_positions=512"))["max_len"] == 512
    assert encoding_options(compose("encoding=learned", "train.random_positions=512"))["max_len"] == 512
    assert encoding_options(compose("encoding=multiplicative", "train.random_positions=512"))["max_len"] == 512
    assert encoding_options(compose("encoding=learned", "train.random_positions=512", "encoding.max_len=600"))["max_len"] == 600
    with pytest.raises(PosbenchError, match=r"^encoding.max_len=256 cannot hold the positions of train.random_positions=512"):
        encoding_options(compose("encoding=learned", "train.random_positions=512", "encoding.max_len=256"))
    assert "max_len" not in encoding_options(compose("encoding=alibi", "train.random_positions=512"))


def test_language_model_trains_and_evaluates_with_random_positions(tmp_path):
    """train.random_positions end to end on the packaged corpus: the ladder runs at 16x with
    randomized positions, and settings that cannot work are one-line errors that leave nothing."""
    import pandas as pd

    from conftest import SMOKE, posbench

    run = tmp_path / "rope"
    posbench("train", *SMOKE, "encoding=rope", "train.steps=6", "train.random_positions=512",
             f"hydra.run.dir={run}")
    rows = pd.read_csv(run / "results.csv")
    assert rows.eval_len.tolist() == [32, 64, 128, 256, 512] and (rows.status == "ok").all()
    assert rows.ppl.notna().all()
    for args, message in [(["encoding=nope", "train.random_positions=512"], "reads no positions"),
                          (["encoding=rope", "train.random_positions=256"], "train.random_positions >= 512")]:
        bad = tmp_path / "bad"
        proc = posbench("train", *SMOKE, *args, f"hydra.run.dir={bad}", check=False)
        assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr[-500:]
        assert not bad.exists()
