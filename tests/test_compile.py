"""``train.compile=true``: the compiled model trains, and its loss and gradients match eager mode.

Rotary encodings once read their angle table's size from the positions (a host value) in every
layer, a graph break inside the attention block; compiled, they now compute the angles in the
graph, and the whole forward is one graph."""

import shutil

import pytest
import torch

from posbench.model.build import build_model

from conftest import compose

pytestmark = pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")),
                                reason="torch.compile on CPU needs a C++ compiler")


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_compiled_training_step_matches_eager(encoding):
    torch._dynamo.reset()
    torch.manual_seed(0)
    # two layers of a narrow model at the default train_len: the compile, not the size, is under test
    model = build_model(compose(f"encoding={encoding}", "device=cpu", "model.n_layers=2", "model.d_model=64",
                                "model.n_heads=2", "model.d_ff=128"), 512)
    x, y = torch.randint(0, 512, (2, 4, 128))
    results = []
    for net in (model, torch.compile(model)):
        model.zero_grad()
        with torch.autocast("cpu", torch.bfloat16):
            loss = net(x, targets=y)
        loss.backward()
        results.append((loss.detach().float(), [p.grad.clone() for p in model.parameters()]))
    (eager, eager_grads), (compiled, compiled_grads) = results
    assert torch.isfinite(compiled) and compiled.item() == pytest.approx(eager.item(), rel=1e-2)
    for a, b in zip(eager_grads, compiled_grads):  # bf16 rounding differs between the kernels: compare norms
        assert (a - b).norm() <= 0.05 * a.norm()


@pytest.mark.parametrize("encoding", ["rope", "xpos"])
def test_the_compiled_blocks_are_one_graph(encoding):
    """Embedding, every block and the final norm compile as one graph (the loss after them may
    break once, where it checks for a task's ignored targets)."""
    torch._dynamo.reset()
    model = build_model(compose(f"encoding={encoding}", "device=cpu", "model.n_layers=2"), 256)
    x = torch.randint(0, 256, (2, 128))
    explained = torch._dynamo.explain(model.hidden)(x)
    assert explained.graph_break_count == 0, explained.break_reasons
