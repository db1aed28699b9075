"""hope, resonance_rope, clip_rope and fope against their papers' formulas: attention computed token
by token in float64 from each scheme's definition, compared with the encoding's rotation through
posbench's attention; causality; and each scheme's defining property."""

import cmath
import math

import pytest
import torch

from posbench.encodings import ModelDims, build_encoding
from posbench.errors import PosbenchError
from posbench.model.attention import reference_attention

HS, BASE, L = 16, 10000.0, 64  # head_dim 16: 8 pairs; training length 64
DIMS = ModelDims(d_model=32, n_heads=2, n_layers=2, train_len=L)
PAIRS = HS // 2
ROPE = [BASE ** (-2 * i / HS) for i in range(PAIRS)]  # theta_i, Su et al. eq. 15
WAVE = [2 * math.pi / f for f in ROPE]  # 2 pi 10^(i/2): 6.3, 19.9, 62.8, 198.7, 628, 1987, 6283, 19869


def hope_freqs(cutoff=L):
    """Chen et al. 2025: theta_i where 2 pi / theta_i <= L, else 0 (no rotation)."""
    return [f if 2 * math.pi / f <= cutoff else 0.0 for f in ROPE]


def resonance_freqs():
    """Wang et al. 2024: theta'_i = 2 pi / round(2 pi / theta_i)."""
    return [2 * math.pi / round(2 * math.pi / f) for f in ROPE]


def clip_freqs(n):
    """Li et al. 2026: the lowest n frequencies times 0.5 (1 + cos(pi j / (n - 1))), j = 0 .. n-1."""
    out = list(ROPE)
    for j in range(n):
        out[PAIRS - n + j] *= 0.5 * (1 + math.cos(math.pi * j / (n - 1))) if n > 1 else 1.0
    return out


def rotation(freqs):
    """Pair d = (x_d, x_{d+hs/2}) as x_d + i x_{d+hs/2}, times exp(i p theta_d)."""
    return lambda head, p: [cmath.exp(1j * p * f) for f in freqs]


def fope_rotation(enc, layer):
    """Hua et al. 2024: pair d times C_d(p) + i S_d(p), C_d = sum_D a^cos_{D,d} cos(theta_D p) and S_d
    likewise with sin, for d < N; times 1 + i (both series padded with ones) for the rest."""
    freq, cos_coef, sin_coef = enc.freq.double().tolist(), enc.cos_coef[layer].double(), enc.sin_coef[layer].double()

    def factors(head, p):
        out = []
        for d in range(PAIRS):
            if d >= cos_coef.shape[-1]:
                out.append(1 + 1j)
                continue
            c = sum(float(cos_coef[head, m, d]) * math.cos(f * p) for m, f in enumerate(freq))
            s = sum(float(sin_coef[head, m, d]) * math.sin(f * p) for m, f in enumerate(freq))
            out.append(complex(c, s))
        return out
    return factors


def direct_attention(q, k, v, pos, factors):
    """Causal softmax attention, every logit q_i'.k_j' / sqrt(hs) summed pair by pair in float64:
    Re(sum_d q'_d conj(k'_d)) is the real dot product of the rotated vectors. -> (B, H, T, hs)."""
    B, H, T, hs = q.shape
    out = torch.zeros(B, H, T, hs, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            rq = [[complex(q[b, h, t, d], q[b, h, t, d + PAIRS]) * z for d, z in enumerate(factors(h, int(pos[t])))]
                  for t in range(T)]
            rk = [[complex(k[b, h, t, d], k[b, h, t, d + PAIRS]) * z for d, z in enumerate(factors(h, int(pos[t])))]
                  for t in range(T)]
            for i in range(T):
                logits = torch.tensor([sum((a * b_.conjugate()).real for a, b_ in zip(rq[i], rk[j])) / math.sqrt(hs)
                                       for j in range(i + 1)], dtype=torch.float64)
                out[b, h, i] = logits.softmax(0) @ v[b, h, :i + 1].double()
    return out


def posbench_attention(enc, q, k, v, pos, layer=0):
    qr, kr = enc.rotate(q, k, pos, layer)
    return reference_attention(qr, kr, v, enc, pos, layer)


def qkv(T=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, T, HS, generator=g) for _ in range(3)]


CASES = {
    "hope": ({"name": "hope"}, lambda enc: rotation(hope_freqs())),
    "resonance_rope": ({"name": "resonance_rope"}, lambda enc: rotation(resonance_freqs())),
    "clip_rope": ({"name": "clip_rope"}, lambda enc: rotation(clip_freqs(5))),  # 5 wavelengths exceed L = 64
    "fope": ({"name": "fope"}, lambda enc: fope_rotation(enc, 1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_attention_equals_the_papers_formula_token_by_token(name):
    cfg, factors = CASES[name]
    enc = build_encoding(cfg, DIMS)
    q, k, v = qkv()
    pos = torch.arange(5, 17)  # not starting at 0: the rotation reads the position values
    layer = 1 if name == "fope" else 0
    got = posbench_attention(enc, q, k, v, pos, layer)
    assert torch.allclose(got.double(), direct_attention(q, k, v, pos, factors(enc)), atol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_causal_later_tokens_change_nothing_before_them(name):
    enc = build_encoding(CASES[name][0], DIMS)
    q, k, v = qkv(T=10)
    pos = torch.arange(10)
    before = posbench_attention(enc, q, k, v, pos)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, 6:] = torch.randn_like(x[:, :, 6:])
    after = posbench_attention(enc, q2, k2, v2, pos)
    assert torch.equal(before[:, :, :6], after[:, :, :6]) and not torch.equal(before[:, :, 6:], after[:, :, 6:])


# ---- HoPE --------------------------------------------------------------------------------------

@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_hope_rotates_only_the_pairs_whose_wavelength_fits_and_leaves_the_rest_bit_for_bit(pairing):
    enc = build_encoding({"name": "hope", "pairing": pairing}, DIMS)
    kept = sum(w <= L for w in WAVE)
    assert kept == enc.pairs == 3  # 62.8 <= 64 < 198.7
    q, k, _ = qkv(T=20)
    pos = torch.arange(20)
    got, _ = enc.rotate(q, k, pos, 0)
    dims = list(range(kept, PAIRS)) + list(range(PAIRS + kept, HS)) if pairing == "half" else list(range(2 * kept, HS))
    assert torch.equal(got[..., dims], q[..., dims])  # the low-frequency pairs carry no position
    assert not torch.equal(got[..., :kept], q[..., :kept])
    assert enc.inv_freq("none", 1.0).tolist()[kept:] == [0.0] * (PAIRS - kept)


def test_hope_cutoff_follows_the_training_length_or_cutoff_len():
    assert build_encoding({"name": "hope"}, ModelDims(32, 2, 1, train_len=200)).pairs == 4  # 198.7 <= 200
    assert build_encoding({"name": "hope", "cutoff_len": 20}, DIMS).pairs == 2
    with pytest.raises(PosbenchError, match=r"hope rotates the pairs .* none is .*cutoff_len >= 7"):
        build_encoding({"name": "hope", "cutoff_len": 6}, DIMS)


# ---- Resonance RoPE ---------------------------------------------------------------------------

@pytest.mark.parametrize("base,hs", [(10000.0, 16), (10000.0, 128), (500000.0, 128)])
def test_resonance_every_wavelength_is_the_rounded_whole_number(base, hs):
    enc = build_encoding({"name": "resonance_rope", "base": base}, ModelDims(hs * 2, 2, 1, 64))
    lam = enc.wavelengths()
    assert torch.equal(lam, lam.round()) and lam.min() >= 1
    # the reference's rounding: torch.round(2 pi / inv_freq) of the fp32 frequencies 1 / base^(2i/hs)
    ref = torch.round(2 * math.pi / (1.0 / base ** (torch.arange(0, hs, 2).float() / hs)))
    assert torch.equal(lam, ref)
    assert lam.tolist() == [float(round(2 * math.pi * base ** (2 * i / hs))) for i in range(hs // 2)]
    assert torch.allclose(enc.inv_freq("none", 1.0) * lam, torch.full_like(lam, 2 * math.pi))


def test_resonance_angles_repeat_exactly_every_wavelength():
    enc = build_encoding({"name": "resonance_rope"}, DIMS)
    lam = enc.wavelengths().long()
    pos = torch.arange(0, 3000)
    cos, sin = enc.angle_table(pos, "none", 1.0)
    for i, period in enumerate(lam.tolist()[:5]):  # wavelengths 6 .. 628 tokens: several periods each
        assert torch.equal(cos[period:, i], cos[:-period, i]) and torch.equal(sin[period:, i], sin[:-period, i])


# ---- clipped RoPE -----------------------------------------------------------------------------

def test_clip_rope_tapers_the_lowest_pairs_and_keeps_the_others():
    enc = build_encoding({"name": "clip_rope"}, DIMS)
    n = sum(w > L for w in WAVE)
    assert enc.clipped == n == 5
    freq = enc.inv_freq("none", 1.0).double()
    assert torch.allclose(freq, torch.tensor(clip_freqs(n), dtype=torch.float64), rtol=1e-6)
    assert torch.equal(enc.inv_freq("none", 1.0)[:PAIRS - n], build_encoding({"name": "rope"}, DIMS).inv_freq(
        "none", 1.0)[:PAIRS - n])  # above the cutoff: RoPE's, unchanged
    assert freq[PAIRS - n] == pytest.approx(ROPE[PAIRS - n], rel=1e-6) and freq[-1] == 0  # taper 1 -> 0
    assert freq[PAIRS - 3] == pytest.approx(ROPE[PAIRS - 3] * 0.5, rel=1e-6)  # j = 2 of 0..4: cos(pi / 2), half way
    _, sin = enc.angle_table(torch.arange(100), "none", 1.0)
    assert sin[:, -1].abs().max() == 0  # the lowest pair does not rotate


def test_clip_rope_reference_count_and_bad_values():
    enc = build_encoding({"name": "clip_rope", "clipped": 20}, ModelDims(256, 2, 1, 8192))  # hs 128: Llama 3's 64 pairs
    taper = enc.taper
    assert torch.equal(taper[:44], torch.ones(44)) and taper[44] == 1 and taper[-1] == 0
    assert torch.all(taper[44:-1] - taper[45:] > 0)  # strictly decreasing over the clipped pairs
    assert build_encoding({"name": "clip_rope", "clipped": 1}, DIMS).taper.tolist() == [1.0] * PAIRS  # as reference
    with pytest.raises(PosbenchError, match=r"clip_rope clipped must be an integer in 0..8 .* got 9"):
        build_encoding({"name": "clip_rope", "clipped": 9}, DIMS)


# ---- RoPE scalings at inference --------------------------------------------------------------

@pytest.mark.parametrize("kind", ["pi", "ntk", "yarn"])
def test_scalings_keep_each_schemes_property(kind):
    """A RoPE scaling at inference changes the frequencies first; HoPE's unrotated and the clipped
    RoPE's frozen pairs stay unrotated, and Resonance RoPE rounds the scaled wavelengths."""
    pos = torch.arange(300)
    hope, clip = build_encoding({"name": "hope"}, DIMS), build_encoding({"name": "clip_rope"}, DIMS)
    for enc, still in ((hope, slice(3, None)), (clip, slice(-1, None))):
        _, sin = enc.angle_table(pos, kind, 4.0)
        assert sin[:, still].abs().max() == 0, enc.name
    resonance = build_encoding({"name": "resonance_rope"}, DIMS)
    lam = resonance.wavelengths(kind, 4.0)
    assert torch.equal(lam, lam.round())
    if kind != "pi":  # pi divides the positions: their angles are not whole periods
        cos, _ = resonance.angle_table(pos, kind, 4.0)
        period = int(lam[1])
        assert torch.equal(cos[period:, 1], cos[:-period, 1])


# ---- FoPE -------------------------------------------------------------------------------------

def test_fope_drops_the_frequencies_below_the_floor():
    enc = build_encoding({"name": "fope"}, DIMS)
    kept = [f for f in ROPE if f >= 2 * math.pi / L]
    assert enc.freq.tolist() == pytest.approx(kept) and len(kept) == 3  # 0.1 >= 2 pi / 64 > 0.0316
    assert enc.outputs == min(3, HS // 4) == 3  # N: the pairs that get a series
    assert enc.cos_coef.shape == enc.sin_coef.shape == (2, 2, 3, 3)  # (layers, heads, M, N)
    few = build_encoding({"name": "fope"}, ModelDims(32, 2, 2, train_len=8192))  # M 7 > hs/4: N 4
    assert (few.freq.numel(), few.outputs) == (7, 4)
    assert not enc.cos_coef.requires_grad and "cos_coef" in enc.state_dict()  # fixed, saved with the run


def test_fope_with_gain_zero_is_the_step_identity():
    """gain 0 leaves the step identity: with M = 7 frequencies for N = 4 pairs (train_len 8192),
    pair d rotates at theta_{d ceil(7/4)} = theta_{2d} (d = 0 .. 3: 0, 2, 4, 6); the other four
    pairs are times 1 + i (both series padded with ones)."""
    enc = build_encoding({"name": "fope", "gain": 0.0}, ModelDims(32, 2, 2, train_len=8192))
    freqs = [ROPE[0], ROPE[2], ROPE[4], ROPE[6]]
    q, k, v = qkv()
    pos = torch.arange(12)

    def factors(head, p):
        return [cmath.exp(1j * p * f) for f in freqs] + [1 + 1j] * (PAIRS - 4)
    got = posbench_attention(enc, q, k, v, pos)
    assert torch.allclose(got.double(), direct_attention(q, k, v, pos, factors), atol=1e-5)


def test_fope_init_is_xavier_normal_around_the_identity_and_learnable_trains():
    dims = ModelDims(d_model=512, n_heads=8, n_layers=8, train_len=4096)  # hs 64: M 23 frequencies, N 16
    torch.manual_seed(0)
    enc = build_encoding({"name": "fope", "gain": 0.5}, dims)
    M, N = enc.freq.numel(), enc.outputs
    noise = enc.cos_coef.clone()  # less the step identity:
    step = math.ceil(M / N)
    for d in range(N):
        if d * step < M:
            noise[..., d * step, d] -= 1
    std = 0.5 * math.sqrt(2 / (M * N + 8 * N))  # xavier_normal_ of an (H, M, N) table: fans M*N and H*N
    assert noise.std().item() == pytest.approx(std, rel=0.05) and abs(noise.mean().item()) < 0.1 * std
    learned = build_encoding({"name": "fope", "learnable": True}, DIMS)
    assert {n for n, _ in learned.named_parameters()} == {"cos_coef", "sin_coef"}


def test_fope_bad_options_are_one_line():
    with pytest.raises(PosbenchError, match=r"fope keeps the frequencies >= 2 pi / L; none is at L = 6"):
        build_encoding({"name": "fope", "cutoff_len": 6}, DIMS)
    with pytest.raises(PosbenchError, match=r"fope gain must be >= 0, got -1"):
        build_encoding({"name": "fope", "gain": -1.0}, DIMS)
