"""Learned position parameters train, and the learned bias is drawn as the encoding computes it."""

import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import SMOKE, compose, posbench
from posbench.model.build import build_model
from posbench.encodings import REGISTRY, ModelDims, build_encoding
from posbench.report.learned_bias import (bias_by_distance, has_learned_bias, learned_bias_figure, run_bias,
                                          write_report_figure, write_run_figure)
from posbench.train.optim import make_optimizer
from posbench.data.windows import WindowSampler

DIMS = ModelDims(d_model=32, n_heads=4, n_layers=2, train_len=16)
TINY = ["model.d_model=32", "model.n_heads=4", "model.n_layers=2", "model.d_ff=64"]
VARIANTS = [("alibi", {"learned_slopes": True}), ("t5", {"per_layer": True}), ("t5", {"bias_scale": "none"})]


def with_parameters():
    """Every registered encoding whose default build has trainable parameters, and the variants
    that add some (learned ALiBi slopes) or change them."""
    names = [(name, {}) for name in sorted(REGISTRY)
             if any(p.requires_grad for p in build_encoding({"name": name}, DIMS).parameters())]
    return names + VARIANTS


def learned_biases():
    return [(name, params) for name, params in with_parameters()
            if has_learned_bias(build_encoding({"name": name, **params}, DIMS))]


def test_the_learned_biases_are_the_ones_with_parameters():
    assert sorted({name for name, _ in learned_biases()}) == ["alibi", "dynamic", "fire", "kerple_log",
                                                              "kerple_power", "t5"]
    assert not has_learned_bias(build_encoding({"name": "alibi"}, DIMS))  # fixed slopes
    assert not has_learned_bias(build_encoding({"name": "sandwich"}, DIMS))


# ---- position parameters move in a short run on the real corpus ------------------------------

STEPS, LR = 40, 1e-3


@pytest.fixture(scope="module")
def corpus():
    from posbench.data.corpus import load_corpus

    return load_corpus(compose(*SMOKE).data)


def contrast(encoding, max_distance=32):
    """bias(d) - bias(0) per layer, head and distance: what softmax sees of a learned bias."""
    by_curve = bias_by_distance(encoding, max_distance).bias.to_numpy().reshape(-1, max_distance + 1)  # distance 0 first
    return by_curve - by_curve[:, :1]


@pytest.mark.parametrize("name, params", with_parameters())
def test_position_parameters_move_in_a_short_run(name, params, corpus):
    """40 AdamW steps at lr 1e-3 on smoke-preset windows of the packaged corpus (a tiny model).
    No entry can move more than STEPS * LR = 0.04; the encoding's parameters must move an RMS of at
    least 5% of that, and a learned bias must change its contrast bias(d) - bias(0) by at least
    0.01 logits at some distance <= 32. The RMS is over the tensors with a gradient at the first
    step: a tensor whose gradient is exactly zero there sits behind a zero-initialised gate (TAPE's
    W_x and W_down behind W_up = 0, as its reference initialises them), and moves only once the
    gate opens, which 40 steps need not reach; at least one tensor must have a gradient."""
    overrides = [f"encoding.{key}={str(value).lower()}" for key, value in params.items()]
    cfg = compose(*SMOKE, f"encoding={name}", *overrides, *TINY, f"train.lr={LR}")
    torch.manual_seed(0)
    model = build_model(cfg, corpus.vocab_size)
    params_ = [p for p in model.encoding.parameters() if p.requires_grad]
    before = torch.cat([p.detach().flatten() for p in params_])
    bias_before = contrast(model.encoding) if has_learned_bias(model.encoding) else None
    optimizer = make_optimizer(model, cfg.train)
    sampler = WindowSampler(corpus.splits["train"], int(cfg.train.train_len), int(cfg.train.batch_size), 0)
    live = None
    for _ in range(STEPS):
        x, y, _ = sampler()  # positions: None (0..T-1)
        optimizer.zero_grad()
        model(x, y).backward()
        if live is None:  # the tensors with a gradient at the first step
            live = [p.grad is not None and bool(p.grad.abs().sum() > 0) for p in params_]
        optimizer.step()
    assert any(live), f"{name} {params}: no parameter of the encoding has a gradient"
    sizes = [p.numel() for p in params_]
    moved = (torch.cat([p.detach().flatten() for p in params_]) - before).split(sizes)
    rms = torch.cat([m for m, keep in zip(moved, live) if keep]).pow(2).mean().sqrt().item()
    assert rms >= 0.05 * STEPS * LR, f"{name} {params}: parameters moved an RMS of only {rms:.2g}"
    if bias_before is not None:
        moved = np.abs(contrast(model.encoding) - bias_before).max()
        assert moved >= 0.01, f"{name} {params}: the bias contrast moved only {moved:.3g} logits"


# ---- the drawn values are the encoding's own bias ------------------------------------------------

@pytest.mark.parametrize("name, params", learned_biases())
def test_bias_by_distance_is_the_encodings_bias(name, params):
    """Every row equals the full (T, T) bias matrix of the encoding at query T - 1 and key
    T - 1 - distance, in every layer that has its own bias."""
    torch.manual_seed(0)
    enc = build_encoding({"name": name, **params}, DIMS)
    for p in enc.parameters():  # away from the init, so heads and layers differ
        p.data.add_(0.1 * torch.randn_like(p)).abs_()
    D = 40
    table = bias_by_distance(enc, D)
    layers = 1 if enc.layer_invariant_bias else DIMS.n_layers
    assert len(table) == layers * DIMS.n_heads * (D + 1)
    with torch.no_grad():
        for layer in range(layers):
            full = enc.bias(torch.arange(D + 1), torch.arange(D + 1), layer)  # (H, D+1, D+1)
            rows = table[table.layer == layer]
            heads, distances = torch.tensor(rows["head"].to_numpy()), torch.tensor(rows.distance.to_numpy())
            want = full[heads, D, D - distances]
            assert np.allclose(rows.bias.to_numpy(), want.numpy(), atol=1e-6)


def svg_ids(path):
    return {el.get("id") for el in ET.parse(path).iter() if el.get("id")}


def test_run_figure_draws_every_layer_and_head(tmp_path):
    torch.manual_seed(0)
    enc = build_encoding({"name": "t5", "per_layer": True}, DIMS)
    files = write_run_figure(enc, tmp_path, max_distance=20)
    assert [f.name for f in files] == ["learned_bias.png", "learned_bias.svg"] and all(f.stat().st_size for f in files)
    assert {f"bias:{layer}:{head}" for layer in range(2) for head in range(4)} <= svg_ids(tmp_path / "learned_bias.svg")
    table = bias_by_distance(enc, 20)
    fig = learned_bias_figure(table, "t5")
    lines = {line.get_gid(): line for ax in fig.axes for line in ax.lines}
    with torch.no_grad():
        head2_layer1 = enc.bias(torch.tensor([20]), torch.arange(21), 1)[2, 0]  # keys 0..20: distances 20..0
    assert np.allclose(lines["bias:1:2"].get_ydata(), head2_layer1.flip(0).numpy())
    assert list(lines["bias:1:2"].get_xdata()) == list(range(21))
    assert write_run_figure(build_encoding({"name": "alibi"}, DIMS), tmp_path / "none") == []  # nothing learned


@pytest.mark.slow
def test_train_eval_and_report_draw_the_learned_bias(tmp_path):
    """End to end on the smoke preset: train and eval write learned_bias.png/.svg into the run
    dir, report draws every run's bias into the report dir; a run without one adds nothing."""
    from posbench.report.build import report

    run = tmp_path / "kerple_log"
    posbench("train", *SMOKE, "encoding=kerple_log", *TINY, "train.steps=4", "eval.lengths=[32]",
             f"hydra.run.dir={run}")
    assert (run / "learned_bias.svg").is_file() and (run / "learned_bias.png").is_file()
    assert {f"bias:0:{head}" for head in range(4)} <= svg_ids(run / "learned_bias.svg")  # shared: layer 0 only
    assert "corpus sotu, 4 steps" in (run / "learned_bias.svg").read_text()  # the run's setup under the title
    (run / "learned_bias.png").unlink()
    posbench("eval", f"checkpoint={run}", "device=cpu", "eval.lengths=[32]", "eval.recompute=true")
    assert (run / "learned_bias.png").is_file()
    done = report([run], tmp_path / "report", reference=None)
    assert {"learned_bias.png", "learned_bias.svg"} <= {f.name for f in done.files}
    assert {f"bias:kerple_log:0:0:{head}" for head in range(4)} <= svg_ids(tmp_path / "report" / "learned_bias.svg")
    assert "corpus sotu, 4 steps" in (tmp_path / "report" / "learned_bias.svg").read_text()
    no_checkpoint = tmp_path / "copy"
    no_checkpoint.mkdir()
    (no_checkpoint / "results.csv").write_bytes((run / "results.csv").read_bytes())
    assert write_report_figure([no_checkpoint], tmp_path / "none") == []  # results only: nothing to draw
    # an exported run keeps the table in place of the weights: its report draws the same lines
    from posbench.report.baselines import export_baseline

    exported = export_baseline([run], tmp_path / "bundle")[0]
    assert (exported / "learned_bias.npz").is_file() and not list(exported.rglob("*.pt"))
    assert report([exported], tmp_path / "from_bundle", reference=None).files
    lines = [{i for i in svg_ids(d / "learned_bias.svg") if i.startswith("bias:")} for d in (tmp_path / "report",
                                                                                               tmp_path / "from_bundle")]
    assert lines[0] == lines[1] == {f"bias:kerple_log:0:0:{head}" for head in range(4)}
    (original, bias), (options, table) = run_bias(run), run_bias(exported)
    assert options == original
    pd.testing.assert_frame_equal(table, bias, check_dtype=False)  # the bias bit for bit (float32 in both)
