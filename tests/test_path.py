"""PaTH attention (posbench.encodings.path, posbench.model.householder): the chunked kernel against
the transforms multiplied out token by token in float64; its special cases; the encoding's
transforms (unit w, beta in (0, 2), causal), initialisation and gradients."""

import math

import pytest
import torch
import torch.nn.functional as F

from posbench.encodings import REGISTRY, ModelDims
from posbench.model.attention import causal_attention
from posbench.model.householder import householder_attention


def direct(q, k, v, w, beta, scale, window=0, decay=None):
    """Every logit q_i^T H_i ... H_{j+1} k_j built by applying the transforms to k_j one by one."""
    q, k, v, w, beta = (t.double() for t in (q, k, v, w, beta))
    B, H, T, d = q.shape
    out = torch.zeros_like(v)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                logits = torch.full((T,), -math.inf, dtype=torch.float64)
                for j in range(i + 1):
                    if window and i - j >= window:
                        continue
                    vec = k[b, h, j].clone()
                    for t in range(j + 1, i + 1):
                        vec = vec - beta[b, h, t] * (w[b, h, t] @ vec) * w[b, h, t]
                    logits[j] = scale * (q[b, h, i] @ vec)
                    if decay is not None:
                        logits[j] += decay[b, h, i] - decay[b, h, j]
                out[b, h, i] = logits.softmax(0) @ v[b, h]
    return out


def inputs(B=2, H=2, T=11, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, d, generator=g) for _ in range(3))
    w = F.normalize(torch.randn(B, H, T, d, generator=g), dim=-1)
    beta = 2 * torch.rand(B, H, T, generator=g)
    return q, k, v, w, beta


@pytest.mark.parametrize("grad", [True, False])  # autograd's functional steps, or one buffer updated in place
@pytest.mark.parametrize("chunk", [1, 3, 4, 11, 16])
def test_chunked_kernel_equals_the_transforms_multiplied_out(chunk, grad):
    q, k, v, w, beta = inputs()
    pos = torch.arange(q.shape[2])
    with torch.set_grad_enabled(grad):
        got = householder_attention(q, k, v, w, beta, 0.5, pos, chunk=chunk)
    torch.testing.assert_close(got.double(), direct(q, k, v, w, beta, 0.5), atol=2e-5, rtol=1e-4)


def test_window_and_decay_and_an_offset_position_range():
    q, k, v, w, beta = inputs(T=10, seed=1)
    decay = (-torch.rand(2, 2, 10)).cumsum(-1)
    with torch.no_grad():
        got = householder_attention(q, k, v, w, beta, 0.3, torch.arange(10) + 7, decay=decay, window=4, chunk=3)
    torch.testing.assert_close(got.double(), direct(q, k, v, w, beta, 0.3, window=4, decay=decay), atol=2e-5, rtol=1e-4)


def test_beta_zero_is_plain_causal_attention_and_beta_two_a_reflection():
    q, k, v, w, beta = inputs(T=9, seed=2)
    pos = torch.arange(9)
    plain = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
    torch.testing.assert_close(householder_attention(q, k, v, w, torch.zeros_like(beta), 0.5, pos, chunk=4), plain,
                               atol=1e-5, rtol=1e-5)
    # beta = 2 and one w for every token: H_t is the reflection R; R R = I, so only odd distances see R k_j
    w1 = w[:, :, :1].expand_as(w)
    refl = k - 2 * (k * w1).sum(-1, keepdim=True) * w1
    logits = torch.where((torch.arange(9)[:, None] - torch.arange(9)[None]) % 2 == 1,
                         q @ refl.transpose(-1, -2), q @ k.transpose(-1, -2)) * 0.5
    want = logits.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), -math.inf).softmax(-1) @ v
    torch.testing.assert_close(householder_attention(q, k, v, w1, 2 * torch.ones_like(beta), 0.5, pos, chunk=4),
                               want, atol=1e-5, rtol=1e-4)


def encoding(d_model=16, heads=2, layers=2, **options):
    return REGISTRY["path"](ModelDims(d_model=d_model, n_heads=heads, n_layers=layers, train_len=16), **options)


def test_the_encoding_gives_unit_w_beta_in_range_and_starts_at_beta_one():
    enc = encoding()
    x = torch.randn(3, 7, 16)
    with torch.no_grad():
        w, beta = enc.transition(x, 1)
    assert w.shape == (3, 2, 7, 8) and beta.shape == (3, 2, 7)
    torch.testing.assert_close(w.norm(dim=-1), torch.ones(3, 2, 7))
    assert all(float(b.bias.detach().abs().max()) == 0 for b in enc.beta)  # bias 0, weights ~ N(0, 0.02): beta about 1
    assert abs(float(beta.mean()) - 1) < 0.05 and float((beta - 1).abs().max()) < 0.5
    enc.beta[1].bias.data.fill_(8.0)
    with torch.no_grad():
        _, beta = enc.transition(x, 1)
    assert float(beta.min()) > 1.99 and float(beta.max()) < 2.0


def test_the_transforms_are_causal():
    enc = encoding()
    x = torch.randn(1, 9, 16)
    y = x.clone()
    y[:, 5:] += torch.randn(1, 4, 16)
    (w1, b1), (w2, b2) = enc.transition(x, 0), enc.transition(y, 0)
    torch.testing.assert_close(w1[:, :, :5], w2[:, :, :5])
    torch.testing.assert_close(b1[:, :, :5], b2[:, :, :5])
    assert not torch.allclose(w1[:, :, 5], w2[:, :, 5])


def test_through_causal_attention_and_gradients_reach_every_parameter():
    enc = encoding(rank=4, conv_size=3)
    x = torch.randn(2, 12, 16)
    q, k, v = (torch.randn(2, 2, 12, 8, requires_grad=True) for _ in range(3))
    transition = enc.transition(x, 0)
    out = causal_attention(q, k, v, enc, torch.arange(12), 0, transition=transition)
    want = direct(q.detach(), k.detach(), v.detach(), *(t.detach() for t in transition), enc.logit_scale())
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)
    out.square().sum().backward()
    for name, p in enc.named_parameters():
        if name.startswith(("w_proj.0", "w_conv.0", "beta.0")):
            assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("options, message", [({"rank": -1}, "rank=-1"), ({"conv_size": -2}, "conv_size=-2")])
def test_bad_options_are_one_line(options, message):
    from posbench.errors import PosbenchError

    with pytest.raises(PosbenchError, match=message):
        encoding(**options)


def test_full_rank_and_no_convolution():
    enc = encoding(rank=0, conv_size=0)
    assert len(enc.w_conv) == 0 and isinstance(enc.w_proj[0], torch.nn.Linear)
    w, beta = enc.transition(torch.randn(1, 5, 16), 1)
    torch.testing.assert_close(w.norm(dim=-1), torch.ones(1, 2, 5))


def test_path_fox_adds_the_forget_gates_to_the_transforms():
    """PaTH-FoX through causal_attention with its own decay and transition: the transforms
    multiplied out plus sum log sigmoid(W_g x + b_g) between key and query, the gates computed
    here from the weights."""
    from posbench.model.attention import cumulative_decay, token_transforms

    enc = REGISTRY["path_fox"](ModelDims(d_model=16, n_heads=2, n_layers=2, train_len=16), rank=4)
    assert set(enc.hooks()) == {"decay", "transition"} and enc.hook_kind() == "transition"
    assert all(float(g.bias.detach().abs().max()) == 0 and float(g.weight.detach().std()) < 0.05 for g in enc.gates)
    for gate in enc.gates:  # gates far from 1/2, so a lost decay term shows
        torch.nn.init.normal_(gate.weight, std=0.5)
        torch.nn.init.normal_(gate.bias, std=1.0)
    x = torch.randn(2, 10, 16)
    q, k, v = (torch.randn(2, 2, 10, 8, requires_grad=True) for _ in range(3))
    gate = enc.gates[1]
    log_f = torch.log(torch.sigmoid(x.double() @ gate.weight.double().T + gate.bias.double())).transpose(1, 2)
    decay, transition = cumulative_decay(enc, x, 1), token_transforms(enc, x, 1)
    out = causal_attention(q, k, v, enc, torch.arange(10), 1, decay=decay, transition=transition)
    want = direct(q.detach(), k.detach(), v.detach(), *(t.detach() for t in transition), enc.logit_scale(),
                  decay=log_f.cumsum(-1))
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)
    without = direct(q.detach(), k.detach(), v.detach(), *(t.detach() for t in transition), enc.logit_scale())
    assert (out.double() - without).abs().max() > 1e-2
    out.square().sum().backward()
    assert gate.weight.grad is not None and gate.weight.grad.abs().sum() > 0
