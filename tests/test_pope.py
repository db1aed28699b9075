"""pope (Gopalakrishnan et al. 2025, PoPE) against its definition as complex numbers, and the
attention kernel that runs q and k wider than the values."""

import math

import pytest
import torch

from posbench.model.attention import fused_causal
from posbench.encodings import ModelDims, build_encoding
from posbench.errors import PosbenchError

DIMS = ModelDims(d_model=32, n_heads=2, n_layers=2, train_len=16)  # head_dim 16: 16 frequencies
HS, BASE = 16, 10000.0


def complex_logits(q, k, pos, delta):
    """Re sum_c q~_tc conj(k~_sc), q~ = softplus(q) e^{i t theta}, k~ = softplus(k) e^{i (s theta + delta)},
    theta_c = base^(-c/d): the paper's definition, one (t, s) pair at a time in complex128."""
    theta = BASE ** (-torch.arange(HS, dtype=torch.float64) / HS)
    H, T, _ = q.shape
    out = torch.zeros(H, T, T, dtype=torch.float64)
    for t in range(T):
        for s in range(T):
            qt = torch.nn.functional.softplus(q[:, t].double()) * torch.exp(1j * pos[t].double() * theta)
            ks = torch.nn.functional.softplus(k[:, s].double()) * torch.exp(1j * (pos[s].double() * theta + delta))
            out[:, t, s] = (qt * ks.conj()).sum(-1).real
    return out


def test_the_logits_are_the_complex_definition_and_the_phase_is_clamped():
    torch.manual_seed(0)
    enc = build_encoding({"name": "pope", "bias_init": "uniform"}, DIMS)
    with torch.no_grad():
        enc.phase[0, 0, :3] = torch.tensor([1.0, -7.0, -1.0])  # outside [-2 pi, 0] twice: clamped
    delta = enc.phase.detach().clamp(-2 * math.pi, 0).double()[:, 0]  # (H, d)
    assert delta[0, 0] == 0 and delta[0, 1] == pytest.approx(-2 * math.pi) and delta[0, 2] == -1.0
    q, k = torch.randn(1, 2, 7, HS), torch.randn(1, 2, 7, HS)
    pos = torch.tensor([0, 1, 2, 5, 6, 9, 13])  # any increasing positions
    q2, k2 = enc.rotate(q, k, pos, 0)
    assert q2.shape == (1, 2, 7, 2 * HS)
    got = (q2 @ k2.transpose(-1, -2))[0].double()
    expected = torch.stack([complex_logits(q[0, h:h + 1], k[0, h:h + 1], pos, delta[h])[0] for h in range(2)])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_the_logit_depends_on_the_distance_and_content_sets_no_angle():
    """Shifting every position leaves the logits; at distance 0 with delta 0 every component
    adds softplus(q) softplus(k) >= 0, whatever the signs of q and k."""
    torch.manual_seed(1)
    enc = build_encoding({"name": "pope"}, DIMS)
    q, k = torch.randn(1, 2, 5, HS), torch.randn(1, 2, 5, HS)
    pos = torch.arange(5)
    a, b = enc.rotate(q, k, pos, 0), enc.rotate(q, k, pos + 100, 0)
    torch.testing.assert_close(a[0] @ a[1].transpose(-1, -2), b[0] @ b[1].transpose(-1, -2), rtol=1e-4, atol=1e-4)
    q2, k2 = enc.rotate(-q.abs(), -k.abs(), pos, 0)
    same = (q2 * k2).sum(-1)  # query t against key t
    sp = torch.nn.functional.softplus
    torch.testing.assert_close(same, (sp(-q.abs()) * sp(-k.abs())).sum(-1), rtol=1e-5, atol=1e-6)


def test_the_fused_kernel_takes_keys_wider_than_the_values():
    torch.manual_seed(2)
    q, k, v = torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 4)
    logits = (q @ k.transpose(-1, -2) * 0.3).masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(fused_causal(q, k, v, 0.3), logits.softmax(-1) @ v, rtol=1e-5, atol=1e-6)


def test_bad_bias_init_is_one_line():
    with pytest.raises(PosbenchError, match=r"^encoding.bias_init='gauss' is not valid; valid choices: zero, uniform$"):
        build_encoding({"name": "pope", "bias_init": "gauss"}, DIMS)
