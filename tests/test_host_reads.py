"""A training step that never waits for the device: with the fused optimizer (CUDA's), no value
is read on the host inside the step, for every encoding and model option, and a divergence is
still caught, named by its step, and kept out of every checkpoint (posbench.train.loop's
DeferredCheck; the position ends of posbench.encodings.span).

On the CPU, where no step waits, the tests ask for the fused optimizer by hand and make every
host read of a tensor raise: what would be a synchronisation on a GPU is an error here."""

import math
import re

import pytest
import torch

from conftest import SMOKE, compose
from posbench.encodings import REGISTRY
from posbench.encodings.span import distance_range, note_span, span
from posbench.errors import PosbenchError
from posbench.train import loop
from posbench.train.configure import train_config

HOST_READS = ("item", "__bool__", "tolist", "__float__", "__int__", "__index__")
OPTIONS = ["rope+model.length_scaling=logn", "nope+model.length_scaling=ssmax", "rope+model.qk_norm=true",
           "rope+model.window=16", "alibi+model.window=16", "rope+model.gate=elementwise",
           "rope+model.differential=true", "rope+model.sinks=true", "nope+model.layers=dda",
           "nope+model.layers=kka", "rope+model.layers=ma+model.window=16"]


@pytest.fixture
def no_host_reads(monkeypatch):
    """Inside ``with no_host_reads():`` every read of a tensor's value on the host raises."""
    from contextlib import contextmanager

    @contextmanager
    def refusing():
        saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}

        def refuse(name):
            def read(self, *args, **kwargs):
                raise AssertionError(f"a host read inside the step: Tensor.{name}")
            return read
        try:
            for name in HOST_READS:
                setattr(torch.Tensor, name, refuse(name))
            yield
        finally:
            for name, method in saved.items():
                setattr(torch.Tensor, name, method)
    return refusing


def fused_setup(tmp_path, monkeypatch, *overrides):
    monkeypatch.setattr(loop, "fused_optimizer", lambda device: True)
    s = loop.setup(train_config(compose(*SMOKE, "model.d_ff=1024", *overrides)), tmp_path)
    s.state.batches = loop.Prefetcher(s.state.sampler)
    return s


@pytest.mark.parametrize("entry", [*sorted(REGISTRY), *OPTIONS])
def test_a_fused_step_reads_nothing_on_the_host(entry, tmp_path, monkeypatch, no_host_reads):
    name, *options = entry.split("+")
    s = fused_setup(tmp_path, monkeypatch, f"encoding={name}", *options)
    try:
        batches = [s.state.batches() for _ in range(2)]  # drawn first: the sampler reads its own numbers
        with no_host_reads():
            losses = [loop.train_step(s, x, y, positions) for x, y, positions in batches]
        s.check.settle()  # the two steps' checks, read at once
        assert all(math.isfinite(float(loss)) for loss in losses) and s.check.pending == []
    finally:
        s.state.batches.close()


def test_a_diverged_step_is_skipped_and_named_when_read():
    p = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([p], lr=0.1, fused=True)
    check = loop.DeferredCheck()
    for step, loss in ((1, 1.0), (2, math.nan), (3, 2.0)):
        p.grad = torch.ones(3)
        before = p.detach().clone()
        check.flag(optimizer, step, torch.tensor(loss), torch.tensor(1.0))
        optimizer.step()
        check.unflag(optimizer)
        assert torch.equal(p.detach(), before) == (step == 2)  # only the bad step leaves the weights alone
    assert optimizer.state[p]["step"].item() == 2  # nor is it counted in AdamW's bias correction
    with pytest.raises(loop.Diverged) as caught:
        check.settle()
    assert (caught.value.what, caught.value.step) == ("loss", 2) and math.isnan(caught.value.value)
    assert check.pending == []


def test_the_cpu_step_checks_its_own_figures_before_the_update():
    """Without a fused optimizer (the CPU) each step reads its loss, then its gradient norm, and
    raises for the step being taken (Diverged.step None: the error names state.step + 1)."""
    check, optimizer = loop.StepCheck(), object()
    check.flag(optimizer, 3, torch.tensor(2.0), torch.tensor(1.0))
    for loss, norm, what in ((math.nan, math.inf, "loss"), (1.0, math.inf, "gradient norm")):
        with pytest.raises(loop.Diverged) as caught:
            check.flag(optimizer, 4, torch.tensor(loss), torch.tensor(norm))
        assert caught.value.what == what and caught.value.step is None


def test_a_late_read_divergence_names_its_step_and_no_checkpoint_holds_it(tmp_path, monkeypatch):
    """Step 7's gradient norm is NaN; the loop reads it at step 10's log line (log_every 5): the
    error names step 7, the step-5 checkpoint stays, nothing later is written."""
    monkeypatch.setattr(loop, "fused_optimizer", lambda device: True)
    real, calls = torch.nn.utils.clip_grad_norm_, []

    def clip(*args, **kwargs):
        calls.append(1)
        norm = real(*args, **kwargs)
        return norm * math.nan if len(calls) == 7 else norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    run = tmp_path / "run"
    with pytest.raises(PosbenchError) as caught:
        loop.train(train_config(compose(*SMOKE, "train.steps=20", "train.ckpt_every=5")), run)
    assert re.fullmatch(r"gradient norm became nan at step 7; the last good checkpoint \(step 5\) is kept at "
                        r"\S+last\.pt; no results were written; valid: a lower train\.lr \(or check the data\)",
                        str(caught.value)), str(caught.value)
    assert len(calls) == 10  # read at step 10's log line, before its checkpoint
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] == 5 and all(torch.isfinite(t).all() for t in state["model"].values())
    assert not (run / "results.csv").exists()


def test_the_position_ends_are_known_without_a_read(no_host_reads):
    positions = note_span(torch.arange(100), 0, 99)
    given = note_span(torch.tensor([3, 5, 9, 20]), 3, 20)
    with no_host_reads():
        assert span(positions) == (0, 99)
        assert span(positions[40:60]) == (40, 59)  # a query chunk: a slice of noted consecutive positions
        assert span(given) == (3, 20)
        assert distance_range(positions[40:60], positions[:60]) == (40 - 59, 59)  # a query chunk and its keys
    assert span(given[1:3]) == (5, 9)  # a slice of positions with gaps is read (once)
    assert span(torch.tensor([2, 4, 7])) == (2, 7)
    q, k = torch.tensor([2, 5, 9]), torch.tensor([1, 2, 5, 9])
    assert distance_range(q, k) == (int((q[:, None] - k).min()), int((q[:, None] - k).max())) == (-7, 8)
