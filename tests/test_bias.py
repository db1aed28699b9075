"""KERPLE, Sandwich, FIRE and dynamic position bias against values computed here from their papers."""

import math

import pytest
import torch
from conftest import tiny_model

from posbench.encodings import ModelDims, build_encoding

DIMS = ModelDims(d_model=32, n_heads=4, n_layers=2, train_len=16)
NEW = ["kerple_log", "kerple_power", "sandwich", "fire", "dynamic"]
PAIRS = [(0, 0), (1, 0), (5, 3), (9, 1), (20, 7), (39, 0), (39, 38)]  # (i, j), j <= i


def make(name, **params):
    torch.manual_seed(0)
    return build_encoding({"name": name, **params}, DIMS)


def full_bias(enc, T=40, layer=0):
    with torch.no_grad():
        return enc.bias(torch.arange(T), torch.arange(T), layer)  # (H, T, T)


def set_(param, values):
    with torch.no_grad():
        param.copy_(torch.as_tensor(values, dtype=param.dtype))


# ---- KERPLE -------------------------------------------------------------------------------

R1, R2 = [0.5, 1.0, 1.5, 2.0], [0.05, 0.5, 1.0, 1.7]


def kerple_log_reference(r1, r2, distance):
    return -r1 * math.log(1 + r2 * distance)


def kerple_power_reference(r1, r2, distance):
    return -r1 * distance ** r2


KERPLE_REFERENCE = {"kerple_log": kerple_log_reference, "kerple_power": kerple_power_reference}


@pytest.mark.parametrize("name", ["kerple_log", "kerple_power"])
def test_kerple_bias_is_the_kernel_at_known_parameters(name):
    """-r1 log(1 + r2 |i - j|) and -r1 |i - j|^r2 with r1, r2 set by hand, per head."""
    enc = make(name)
    set_(enc.r1, R1)
    set_(enc.r2, R2)
    bias = full_bias(enc)
    for h in range(4):
        for i, j in PAIRS:
            want = KERPLE_REFERENCE[name](R1[h], R2[h], i - j)
            assert bias[h, i, j].item() == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert torch.equal(bias, full_bias(enc, layer=1))  # one set of parameters for all layers


@pytest.mark.parametrize("name, r1, r2, want_r1, want_r2", [
    ("kerple_log", [-3.0, 0.0, 1e-4, 1.0], [-0.5, 0.0, 5.0, 1e-3],
     [0.01, 0.01, 0.01, 1.0], [0.01, 0.01, 5.0, 0.01]),
    ("kerple_power", [-3.0, 0.0, 1e-4, 1.0], [-0.5, 0.0, 5.0, 1.5],
     [0.01, 0.01, 0.01, 1.0], [0.01, 0.01, 2.0, 1.5]),  # exponent capped at 2
])
def test_kerple_parameters_are_projected_back_into_range(name, r1, r2, want_r1, want_r2):
    """After an adversarial update the authors' clamp restores r1, r2 >= 1e-2 (and r2 <= 2 for
    the power kernel) before use; the bias is then the formula at the clamped values."""
    enc = make(name)
    set_(enc.r1, r1)
    set_(enc.r2, r2)
    bias = full_bias(enc)
    assert enc.r1.tolist() == pytest.approx(want_r1) and enc.r2.tolist() == pytest.approx(want_r2)
    for h in range(4):
        want = KERPLE_REFERENCE[name](want_r1[h], want_r2[h], 27)
        assert bias[h, 30, 3].item() == pytest.approx(want, rel=1e-5)
    assert torch.isfinite(bias).all() and (bias <= 0).all()


@pytest.mark.parametrize("name", ["kerple_log", "kerple_power"])
def test_kerple_trains_through_the_projection(name):
    """The in-place clamp runs in every layer's call; backward must still work and give finite
    gradients (|i - j|^r2 at distance 0 included)."""
    model = tiny_model(name, vocab=64, train_len=16, n_layers=2, attn_chunk=8)
    set_(model.encoding.r1, [-1.0, 0.3, 0.3, 0.3])
    set_(model.encoding.r2, [3.0, -1.0, 0.5, 0.5])
    x = torch.randint(0, 64, (2, 16))
    model(x[:, :-1], targets=x[:, 1:]).backward()
    for p in (model.encoding.r1, model.encoding.r2):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
    assert (model.encoding.r1 >= 0.01).all() and (model.encoding.r2 >= 0.01).all()


# ---- Sandwich -----------------------------------------------------------------------------

def sandwich_reference(distance, d_prime, head, n_heads):
    """sum_{k=1}^{d'/2} cos(d / 10000^(2k/d')) - d'/2, divided by 8n/H for head n = head + 1."""
    dot = sum(math.cos(distance / 10000 ** (2 * k / d_prime)) for k in range(1, d_prime // 2 + 1))
    return (dot - d_prime / 2) / (8 * (head + 1) / n_heads)


@pytest.mark.parametrize("d_prime", [16, 128])
def test_sandwich_is_a_compressed_sum_of_cosines(d_prime):
    enc = make("sandwich", dim=d_prime)
    bias = full_bias(enc)
    for h in range(4):
        for i, j in PAIRS:
            want = sandwich_reference(i - j, d_prime, h, 4)
            assert bias[h, i, j].item() == pytest.approx(want, abs=1e-4)
    assert list(enc.parameters()) == []  # parameter-free


def test_sandwich_is_zero_at_distance_zero_and_decreasing_nearby():
    bias = full_bias(make("sandwich"))  # d' = 128
    assert torch.diagonal(bias, dim1=1, dim2=2).abs().max() < 1e-4
    first_column = bias[:, :10, 0]  # distances 0 .. 9
    assert (first_column[:, 1:] < first_column[:, :-1]).all()
    # heads are compressed by 8n/H: head n's bias is head 1's divided by n
    assert torch.allclose(bias[3], bias[0] / 4, atol=1e-5)


# ---- FIRE ---------------------------------------------------------------------------------

def fire_with_linear_mlp(**params):
    """FIRE whose MLP is f_h(x) = (h + 1) x + h / 10 on x >= 0: hidden unit 0 is ReLU(x) = x,
    the other hidden units are 0."""
    enc = make("fire", **params)
    first, second = enc.mlp[0], enc.mlp[2]
    with torch.no_grad():
        first.weight.zero_(), first.bias.zero_(), second.weight.zero_()
        first.weight[0, 0] = 1.0
        second.weight[:, 0] = torch.arange(1.0, 5.0)
        second.bias.copy_(torch.arange(4.0) / 10)
    return enc


def fire_reference(i, j, head, c, L):
    psi = lambda x: math.log(c * x + 1)
    x = psi(i - j) / psi(max(L, i))
    return (head + 1) * x + head / 10


@pytest.mark.parametrize("c, scale", [(0.1, 1.0), (0.5, 0.5)])
def test_fire_is_mlp_of_log_distance_over_log_of_max_threshold_and_query(c, scale):
    enc = fire_with_linear_mlp()  # L0 = train_len = 16
    set_(enc.c, c)
    set_(enc.threshold_scale, scale)
    L = 16 * scale
    bias = full_bias(enc)
    for h in range(4):
        for i, j in PAIRS + [(12, 5), (16, 0), (17, 0)]:
            want = fire_reference(i, j, h, c, L)
            assert bias[h, i, j].item() == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_fire_normaliser_uses_max_of_threshold_and_query():
    """With f the identity, b(i, 0) = psi(i) / psi(max(L, i)): below L it grows with i, from L
    on it is exactly 1 (the input never leaves [0, 1], at any length)."""
    enc = fire_with_linear_mlp(init_threshold=10)
    b = full_bias(enc, T=64)[0, :, 0]  # head 0: f(x) = x
    assert torch.allclose(b[10:], torch.ones(54), atol=1e-5)
    assert (b[1:10] < 1).all() and (b[1:10].diff() > 0).all() and b[0] == 0
    assert b[5].item() == pytest.approx(math.log(1.5) / math.log(2.0), rel=1e-5)  # psi(5)/psi(L=10)


def test_fire_learns_c_and_threshold_and_is_shared_by_layers():
    enc = make("fire")
    assert enc.c.item() == pytest.approx(0.1) and enc.threshold().item() == pytest.approx(16)
    assert torch.equal(full_bias(enc, layer=0), full_bias(enc, layer=1))
    enc.bias(torch.arange(40), torch.arange(40), 0).tril().pow(2).sum().backward()
    assert enc.c.grad.abs() > 0 and enc.threshold_scale.grad.abs() > 0


# ---- dynamic position bias ----------------------------------------------------------------

def test_dynamic_bias_depends_only_on_offset_and_matches_per_pair_mlp():
    enc = make("dynamic")
    T = 30
    bias = full_bias(enc, T)
    for offset in range(T):  # every diagonal i - j = offset is constant
        diag = torch.diagonal(bias, offset=-offset, dim1=1, dim2=2)  # (H, T - offset)
        assert torch.allclose(diag, diag[:, :1].expand_as(diag), atol=1e-6)
    pairs = [(i, j) for i in range(T) for j in range(i + 1)]
    inputs = torch.tensor([[math.copysign(math.log(1 + abs(i - j)), i - j)] for i, j in pairs])
    with torch.no_grad():
        direct = enc.mlp(inputs)  # (pairs, H), the MLP once per pair
    got = torch.stack([bias[:, i, j] for i, j in pairs])
    assert torch.allclose(got, direct, atol=1e-6)


def test_dynamic_runs_its_mlp_once_per_distance():
    enc = make("dynamic")
    rows = []
    enc.mlp.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[0]))
    enc.bias(torch.arange(100, 150), torch.arange(150), 0)
    assert rows == [150]  # Tk distinct distances, not Tq * Tk pairs


# ---- all five -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", NEW)
def test_query_chunk_equals_rows_of_full_bias(name):
    enc = make(name)
    full = full_bias(enc, 40)
    with torch.no_grad():
        chunk = enc.bias(torch.arange(24, 40), torch.arange(40), 0)  # (H, 16, 40)
    causal = torch.ones(40, 40, dtype=torch.bool).tril()[24:]
    assert chunk.shape == (4, 16, 40) and chunk.dtype == torch.float32
    assert torch.allclose(chunk[:, causal], full[:, 24:][:, causal], atol=1e-6)


@pytest.mark.parametrize("name", NEW)
def test_bias_is_float32_under_bf16_autocast(name):
    enc = make(name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bias = enc.bias(torch.arange(40), torch.arange(40), 0)
    assert bias.dtype == torch.float32
    assert torch.allclose(bias, full_bias(enc), atol=1e-5)



