"""p_rope (Barbero et al. 2025's p-RoPE, GPT-NeoX's rotary_pct) against their definitions."""

import math

import pytest
import torch

from posbench.encodings import ModelDims, build_encoding
from posbench.errors import PosbenchError

DIMS = ModelDims(d_model=64, n_heads=2, n_layers=1, train_len=16)  # head_dim 32: 16 pairs
HS, BASE = 32, 10000.0


def complex_rotation(x: torch.Tensor, pos: torch.Tensor, freqs: list[float]) -> torch.Tensor:
    """Interleaved pairs (x_2i, x_2i+1) as complex numbers times exp(i pos freq_i): Su et al.'s
    eq. 34, pair by pair, with a frequency of 0 for a pair that does not rotate."""
    out = x.clone()
    for i, f in enumerate(freqs):
        z = torch.complex(x[..., 2 * i], x[..., 2 * i + 1]) * torch.exp(1j * pos.double() * f).to(torch.complex64)
        out[..., 2 * i], out[..., 2 * i + 1] = z.real, z.imag
    return out


def neox_rotary(x: torch.Tensor, pos: torch.Tensor, pct: float) -> torch.Tensor:
    """GPT-NeoX (``rotary_pct``): rotate dims [0, rd), rd = int(hs * pct), rotate-half within them,
    with inv_freq = base^(-arange(0, rd, 2) / rd); dims [rd, hs) pass through."""
    rd = int(HS * pct)
    inv_freq = 1.0 / BASE ** (torch.arange(0, rd, 2).double() / rd)
    angles = torch.cat([pos.double()[:, None] * inv_freq[None, :]] * 2, -1)
    rot, rest = x[..., :rd].double(), x[..., rd:]
    half = torch.cat((-rot[..., rd // 2:], rot[..., :rd // 2]), -1)
    return torch.cat(((rot * angles.cos() + half * angles.sin()).float(), rest), -1)


def qk(enc, q, k, pos):
    a, b = enc.rotate(q, k, pos, 0)
    return a @ b.transpose(-1, -2)


def test_p_one_is_rope():
    q, k, pos = torch.randn(1, 2, 20, HS), torch.randn(1, 2, 20, HS), torch.arange(20)
    rope, p_rope = build_encoding({"name": "rope"}, DIMS), build_encoding({"name": "p_rope", "fraction": 1.0}, DIMS)
    assert torch.equal(qk(rope, q, k, pos), qk(p_rope, q, k, pos))


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75])
def test_highest_rotates_the_highest_frequencies_and_leaves_the_rest(fraction):
    q, k, pos = torch.randn(1, 2, 20, HS), torch.randn(1, 2, 20, HS), torch.arange(3, 23)
    enc = build_encoding({"name": "p_rope", "fraction": fraction, "pairing": "interleaved"}, DIMS)
    kept = int(fraction * HS // 2)
    freqs = [BASE ** (-2 * i / HS) if i < kept else 0.0 for i in range(HS // 2)]
    got_q, got_k = enc.rotate(q, k, pos, 0)
    assert torch.allclose(got_q, complex_rotation(q, pos, freqs), atol=1e-5)
    assert torch.allclose(got_k, complex_rotation(k, pos, freqs), atol=1e-5)
    assert torch.equal(got_q[..., 2 * kept:], q[..., 2 * kept:])  # the NoPE channels, bit for bit


@pytest.mark.parametrize("pct", [0.25, 0.5])
def test_neox_is_gpt_neox_rotary_pct_up_to_a_permutation_of_dims(pct):
    """NeoX's layout (first rd dims rotate-half, the rest after) and posbench's half pairing
    hold the same pairs at other indexes: q.k over permuted inputs is the same logit."""
    q, k, pos = torch.randn(1, 2, 24, HS), torch.randn(1, 2, 24, HS), torch.arange(24)
    rd, half = int(HS * pct), HS // 2
    # posbench half pairing: pair i is (y_i, y_{i + hs/2}); NeoX: (x_i, x_{i + rd/2}) for i < rd/2
    perm = [None] * HS
    for i in range(rd // 2):
        perm[i], perm[i + half] = i, i + rd // 2
    rest = iter(range(rd, HS))
    perm = [p if p is not None else next(rest) for p in perm]
    enc = build_encoding({"name": "p_rope", "fraction": pct, "form": "neox"}, DIMS)
    want = neox_rotary(q, pos, pct) @ neox_rotary(k, pos, pct).transpose(-1, -2)
    assert torch.allclose(qk(enc, q[..., perm], k[..., perm], pos), want, atol=1e-4, rtol=1e-5)


def test_scalings_leave_the_unrotated_pairs_alone():
    enc = build_encoding({"name": "p_rope", "fraction": 0.5}, DIMS)
    pos = torch.arange(40)
    for kind, s in (("pi", 4.0), ("ntk", 4.0), ("yarn", 4.0)):
        cos, sin = enc.angle_table(pos, kind, s)
        m = 0.1 * math.log(s) + 1 if kind == "yarn" else 1.0
        assert torch.allclose(cos[:, 8:], torch.full_like(cos[:, 8:], m)) and sin[:, 8:].abs().max() == 0, kind
    cos, _ = enc.angle_table(pos, "pi", 4.0)  # pi: the kept pairs at position p / 4
    assert torch.allclose(cos[:, :8], (pos[:, None] / 4 * BASE ** (-torch.arange(0, 16, 2) / HS)).cos(), atol=1e-6)


def test_bad_options_are_one_line():
    with pytest.raises(PosbenchError, match=r"p_rope form 'low' is not valid; valid choices: highest, neox"):
        build_encoding({"name": "p_rope", "form": "low"}, DIMS)
    with pytest.raises(PosbenchError, match=r"p_rope fraction must be in \(0, 1\] .* got 0.01"):
        build_encoding({"name": "p_rope", "fraction": 0.01}, DIMS)  # rounds to no pair of 16
    with pytest.raises(PosbenchError, match=r"got 1.5"):
        build_encoding({"name": "p_rope", "fraction": 1.5}, DIMS)


def test_rope_nope_rotates_all_but_every_nth_layer():
    """Llama 4's pattern: RoPE where (l + 1) % 4 != 0, no position encoding in layers 3, 7, ..."""
    dims = ModelDims(d_model=64, n_heads=2, n_layers=8, train_len=16)
    hybrid, rope = build_encoding({"name": "rope_nope"}, dims), build_encoding({"name": "rope"}, dims)
    q, k, pos = torch.randn(1, 2, 12, HS), torch.randn(1, 2, 12, HS), torch.arange(12)
    for layer in range(8):
        got, want = hybrid.rotate(q, k, pos, layer), rope.rotate(q, k, pos, layer) if (layer + 1) % 4 else (q, k)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), layer
    assert [layer for layer in range(8) if build_encoding({"name": "rope_nope", "nope_every": 2}, dims).is_nope(layer)] \
        == [1, 3, 5, 7]
    with pytest.raises(PosbenchError, match=r"rope_nope nope_every must be an integer >= 2 .* got 1"):
        build_encoding({"name": "rope_nope", "nope_every": 1}, dims)
