"""stickbreaking attention against the reference's formula and its product definition."""

import math

import pytest
import torch
import torch.nn.functional as F

from posbench.model.attention import causal_attention
from posbench.config import ModelConfig
from posbench.encodings import ModelDims, build_encoding
from posbench.model.transformer import LanguageModel

DIMS = ModelDims(d_model=32, n_heads=4, n_layers=2, train_len=8)


def reference(q, k, v, attend_current=False):
    """shawntan/stickbreaking-attention's ``sb_ref.stickbreaking`` with its tests' ``ref_fwd``:
    the cumulative log(1 - beta) by an einsum with a strictly lower-triangular matrix of ones, and
    the remainder on the query's own value."""
    T = q.shape[-2]
    mask = torch.ones(T, T).triu(1 if attend_current else 0).bool()
    cum_weight = torch.ones(T, T).tril(-1)
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    log_z = F.logsigmoid(logits).masked_fill(mask, -1e5)
    log_beta = F.logsigmoid(-logits).masked_fill(mask, 0)
    att = (log_z + torch.einsum("bhij,jk->bhik", log_beta, cum_weight)).exp()
    return att @ v + (1 - att.sum(-1))[..., None] * v


def products(q, k, attend_current=False):
    """A_ij = beta_ij prod_{j<t<i} (1 - beta_it), term by term (t <= i with attend_current)."""
    B, H, T, hs = q.shape
    beta = torch.sigmoid((q @ k.transpose(-1, -2)) / math.sqrt(hs))
    A = torch.zeros(B, H, T, T)
    for i in range(T):
        last = i if attend_current else i - 1
        for j in range(last + 1):
            A[:, :, i, j] = beta[:, :, i, j] * math.prod([1 - beta[:, :, i, t] for t in range(j + 1, last + 1)] or [1])
    return A


@pytest.mark.parametrize("attend_current", [False, True])
@pytest.mark.parametrize("chunk", [1024, 7])
def test_the_kernel_is_the_reference_and_the_product_definition(attend_current, chunk):
    torch.manual_seed(0)
    enc = build_encoding({"name": "stickbreaking", "attend_current": attend_current}, DIMS)
    q, k, v = (torch.randn(2, 4, 24, 8) for _ in range(3))
    got = causal_attention(q, k, v, enc, torch.arange(24), 0, chunk_size=chunk)
    assert torch.allclose(got, reference(q, k, v, attend_current), atol=1e-5)
    A = products(q, k, attend_current)
    assert torch.allclose(got, A @ v + (1 - A.sum(-1, keepdim=True)) * v, atol=1e-5)
    assert (A.sum(-1) <= 1 + 1e-6).all() and (A[:, :, 0].sum(-1) == (1.0 if attend_current else 0.0) * A[:, :, 0, 0]).all()


def test_a_model_trains_with_it_and_nearer_keys_come_first():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, d_ff=64)
    net = LanguageModel(cfg, 40, build_encoding({"name": "stickbreaking"}, LanguageModel.dims(cfg, 8, 40)))
    x = torch.randint(0, 40, (2, 17))
    loss = net(x[:, :-1], targets=x[:, 1:])
    loss.backward()
    assert torch.isfinite(loss) and net.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    # the same logit to every key: the nearest takes sigmoid(z), each farther one a geometrically smaller share
    enc = net.encoding
    logits = torch.zeros(1, 1, 1, 4)
    w = enc.normalize(logits, torch.tensor([4]), torch.arange(4), torch.zeros(1, 4, dtype=torch.bool), 0)
    assert torch.allclose(w[0, 0, 0], torch.tensor([0.5 ** 4, 0.5 ** 3, 0.5 ** 2, 0.5]))
    assert enc.hook_kind() == "normalize" and not enc.reads_positions
