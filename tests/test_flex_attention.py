"""Flex attention for relative biases (posbench/model/attention.py, :func:`flex_causal`) against
today's paths on the CPU, forward and gradients.

CUDA runs flex attention compiled; the CPU has no flex backward, so these tests run flex's eager
reference with its device check lifted: the same score_mod, distance table and block mask the
GPU kernel applies block by block, at one small shape. tests/test_gpu.py checks the compiled
kernel against the same paths on a GPU.
"""

import pytest
import torch
import torch.nn.attention.flex_attention as flex_api

import posbench.model.attention as attention
from posbench.encodings import ModelDims, build_encoding
from posbench.model.attention import causal_attention, distance_table, flex_setting, flex_wanted

from conftest import compose

DIMS = ModelDims(d_model=32, n_heads=2, n_layers=2, train_len=64)
CASES = [("t5", {}), ("kerple_log", {}), ("alibi", {}), ("t5", {"per_layer": True}),
         ("alibi", {"learned_slopes": True})]


@pytest.fixture
def flex_on_cpu(monkeypatch):
    """Flex attention's eager reference, gradients included, on the CPU."""
    monkeypatch.setattr(flex_api, "_validate_device", lambda *args: None, raising=False)


def run(name, params, flex, monkeypatch, window=0):
    """Output and gradients (q, k, v, the encoding's parameters) of layer 1 at B=1, H=2, T=64, hs=16."""
    monkeypatch.setattr(attention, "FLEX", flex)
    torch.manual_seed(0)
    enc = build_encoding({"name": name, **params}, DIMS)
    with torch.no_grad():  # parameters away from their init, so every term matters
        for p in enc.parameters():
            p.add_(0.1 * torch.randn_like(p))
    q, k, v = (torch.randn(1, 2, 64, 16, requires_grad=True) for _ in range(3))
    positions = torch.arange(64)
    out = causal_attention(q, k, v, enc, positions, 1, cache={"contiguous": True}, window=window)
    (out * torch.randn_like(out)).sum().backward()
    grads = {"q": q.grad, "k": k.grad, "v": v.grad}
    grads.update({n: p.grad for n, p in enc.named_parameters() if p.grad is not None})
    return out, grads


@pytest.mark.parametrize("name, params", CASES, ids=[f"{n}{'-' + '-'.join(p) if p else ''}" for n, p in CASES])
@pytest.mark.parametrize("window", [0, 16], ids=["causal", "window 16"])
def test_flex_matches_todays_path_forward_and_gradients(name, params, window, flex_on_cpu, monkeypatch):
    out, grads = run(name, params, True, monkeypatch, window)
    ref, ref_grads = run(name, params, False, monkeypatch, window)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    learned = name != "alibi" or params.get("learned_slopes", False)
    assert grads.keys() == ref_grads.keys() and (len(grads) > 3) == learned  # q, k, v and any parameters
    for key in grads:  # fp32 on both sides: only the order of the sums differs
        torch.testing.assert_close(grads[key], ref_grads[key], rtol=1e-4, atol=5e-5, msg=lambda m, key=key: f"{key}: {m}")


def test_the_distance_table_is_the_bias_of_each_distance():
    enc = build_encoding({"name": "t5"}, DIMS)
    positions = torch.arange(5, 45)  # consecutive, not from 0: the table reads differences only
    table = distance_table(enc, positions, 0)
    bias = enc.bias(positions, positions, 0)  # (H, T, T)
    i, j = torch.tril_indices(40, 40)
    torch.testing.assert_close(table[:, i - j], bias[:, i, j])


def test_flex_is_taken_only_when_asked_for(monkeypatch):
    """Unset, flex is off on CUDA too: its compiled training step failed on a GPU (attention.py)."""
    assert [flex_setting(v) for v in (None, "", "1", "0", "yes")] == [None, None, True, False, None]
    q = torch.zeros(1, 1, 4, 2)
    for setting, wanted in ((None, False), (True, True), (False, False)):
        monkeypatch.setattr(attention, "FLEX", setting)
        assert flex_wanted(q) is wanted
    assert flex_wanted(torch.zeros(1, 1, 4, 2, device="meta")) is False  # neither CPU nor CUDA: off
    monkeypatch.setattr(attention, "FLEX", None)
    assert flex_wanted(torch.zeros(1, 1, 4, 2, device="meta")) is False


def test_a_model_step_through_flex_matches_todays_path(flex_on_cpu, monkeypatch):
    """The whole model: the table built once per forward pass and shared by the layers, its
    gradients summed over them, the contiguity the model states."""
    from posbench.model.build import build_model

    cfg = compose("encoding=kerple_log", "device=cpu", "model.n_layers=2", "model.d_model=32", "model.n_heads=2",
                  "model.d_ff=64")
    x, y = torch.randint(0, 128, (2, 2, 64))
    results = []
    for flex in (True, False):
        monkeypatch.setattr(attention, "FLEX", flex)
        torch.manual_seed(0)
        model = build_model(cfg, 128)
        loss = model(x, targets=y)
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss, grads), (ref_loss, ref_grads) = results
    torch.testing.assert_close(loss, ref_loss)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_a_compiled_model_traces_flex_in_one_graph_compiled_once(monkeypatch):
    """No graph break, and one compile over several calls: the block mask is built inside the
    graph, not read from (and added to) the process-wide cache, whose change would be guarded."""
    import torch._dynamo.testing

    from posbench.model.build import build_model

    monkeypatch.setattr(attention, "FLEX", True)
    monkeypatch.setattr(attention, "_BLOCK_MASKS", {})
    torch._dynamo.reset()
    model = build_model(compose("encoding=t5", "device=cpu", "model.n_layers=2", "model.d_model=32",
                                "model.n_heads=2", "model.d_ff=64"), 128)
    x = torch.randint(0, 128, (2, 96))
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(model.hidden, backend=counter)
    with torch.no_grad():
        eager = model.hidden(x)  # fills the process-wide cache between the compiled calls
        outs = [compiled(x) for _ in range(3)]
    assert counter.frame_count == 1
    assert list(attention._BLOCK_MASKS) == [(96, 0, "cpu")]
    torch.testing.assert_close(outs[-1], eager)
    torch._dynamo.reset()
