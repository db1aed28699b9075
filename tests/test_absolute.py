"""Complex, convolutional and recurrent position encodings against references computed here."""

import cmath
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from posbench.encodings import REGISTRY, ModelDims, build_encoding
from posbench.errors import PosbenchError

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 50
DIMS = ModelDims(d_model=32, n_heads=4, n_layers=2, train_len=16, vocab_size=VOCAB)
NEW = ["complex", "conv", "rnn"]


def make(name, **params):
    torch.manual_seed(0)
    return build_encoding({"name": name, **params}, DIMS)


@pytest.mark.parametrize("name", NEW)
def test_yaml_keys_are_the_constructor_options(name):
    cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "encoding" / f"{name}.yaml"))
    assert cfg.pop("name") == name
    assert sorted(cfg) == sorted(REGISTRY[name].params())
    build_encoding({"name": name, **cfg}, DIMS)


# ---- complex (Wang et al. 2020) ----------------------------------------------------------------

def randomized_complex():
    """A complex encoding whose r (with negative entries), omega and theta are arbitrary."""
    enc = make("complex")
    with torch.no_grad():
        enc.amplitude.weight.normal_()
        enc.frequency.weight.uniform_(-1.5, 1.5)
        enc.phase.weight.uniform_(-3.0, 3.0)
    return enc


def test_complex_matches_the_paper_formula():
    enc = randomized_complex()
    tokens = torch.tensor([[3, 17, 3, 42, 0, 49]])
    out = enc.embed(torch.zeros(1, 6, 32), torch.arange(6), tokens)[0]  # (T, D)
    for pos, word in enumerate(tokens[0].tolist()):
        for k in (0, 5, 15):
            r = enc.amplitude.weight[word, k].item()
            omega, theta = enc.frequency.weight[word, k].item(), enc.phase.weight[word, k].item()
            z = r * cmath.exp(1j * (omega * pos + theta))  # r exp(i(omega pos + theta))
            assert out[pos, k].item() == pytest.approx(z.real, abs=1e-5)
            assert out[pos, 16 + k].item() == pytest.approx(z.imag, abs=1e-5)


def test_complex_shift_is_a_rotation_by_omega_delta_and_amplitude_is_abs_r():
    enc = randomized_complex()
    torch.manual_seed(1)
    tokens = torch.randint(0, VOCAB, (2, 12))
    positions = torch.arange(12)
    with torch.no_grad():
        base = enc.embed(torch.zeros(2, 12, 32), positions, tokens)
        for delta in (1, 7, 300):
            shifted = enc.embed(torch.zeros(2, 12, 32), positions + delta, tokens)
            angle = enc.frequency.weight[tokens] * delta  # (B, T, D/2)
            rotation = torch.stack((torch.stack((angle.cos(), -angle.sin()), -1),
                                    torch.stack((angle.sin(), angle.cos()), -1)), -2)  # (B, T, D/2, 2, 2)
            pairs = torch.stack((base[..., :16], base[..., 16:]), -1)  # (B, T, D/2, 2): (re, im)
            expected = (rotation @ pairs[..., None])[..., 0]
            assert torch.allclose(torch.stack((shifted[..., :16], shifted[..., 16:]), -1), expected, atol=1e-4)
        amplitude = torch.sqrt(base[..., :16] ** 2 + base[..., 16:] ** 2)
        assert torch.allclose(amplitude, enc.amplitude.weight[tokens].abs(), atol=1e-5)


def test_complex_replaces_the_token_embedding():
    enc = make("complex")
    tokens = torch.randint(0, VOCAB, (1, 8))
    a = enc.embed(torch.randn(1, 8, 32), torch.arange(8), tokens)
    b = enc.embed(torch.randn(1, 8, 32), torch.arange(8), tokens)
    assert torch.equal(a, b) and not enc.scale_token_embedding


def test_complex_needs_a_vocabulary_and_even_width():
    enc = build_encoding({"name": "complex"}, ModelDims(32, 4, 2, 16))  # vocab_size 0
    with pytest.raises(PosbenchError, match="vocab_size > 0"):
        enc.embed(torch.zeros(1, 4, 32), torch.arange(4), torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(PosbenchError, match="even d_model"):
        build_encoding({"name": "complex"}, ModelDims(33, 3, 2, 16, vocab_size=VOCAB))


# ---- causal depthwise convolution ------------------------------------------------------------

def test_conv_is_a_weighted_sum_of_the_last_k_inputs():
    k = 5
    enc = make("conv", kernel_size=k)
    with torch.no_grad():
        enc.conv.bias.normal_()
    torch.manual_seed(2)
    x = torch.randn(2, 11, 32)
    with torch.no_grad():
        out = enc.embed(x, torch.arange(11), torch.zeros(2, 11, dtype=torch.long))
    w, b = enc.conv.weight[:, 0, :], enc.conv.bias  # (D, k), (D,)
    for t in range(11):
        expected = x[:, t] + b  # y_t = x_t + b + sum_{j<k} w_j x_{t-j}, x before the start = 0
        for lag in range(k):
            if t - lag >= 0:
                expected = expected + w[:, k - 1 - lag] * x[:, t - lag]  # conv1d is a correlation
        assert torch.allclose(out[:, t], expected, atol=1e-5), t


def test_conv_sees_only_its_window_and_the_zero_padding():
    k = 3
    enc = make("conv", kernel_size=k)
    torch.manual_seed(3)
    x = torch.randn(1, 10, 32)
    t = 6
    with torch.no_grad():
        out = enc.embed(x, torch.arange(10), None)
        for src in range(10):
            y = x.clone()
            y[0, src] += 1.0
            changed = not torch.allclose(enc.embed(y, torch.arange(10), None)[0, t], out[0, t])
            assert changed == (t - k + 1 <= src <= t), src  # inputs t-k+1 .. t, never the future
        same = torch.randn(32).expand(1, 10, 32)  # one token repeated
        rep = enc.embed(same, torch.arange(10), None)[0]
    assert not torch.allclose(rep[0], rep[5])  # position 0 sees the zero padding
    assert not torch.allclose(rep[1], rep[5])
    assert torch.allclose(rep[2], rep[5]) and torch.allclose(rep[5], rep[9])  # past the padding: shift-invariant


# ---- causal GRU ---------------------------------------------------------------------------------

@pytest.mark.parametrize("residual", [True, False])
def test_rnn_equals_a_stepped_gru_cell(residual):
    enc = make("rnn", residual=residual)
    cell = torch.nn.GRUCell(32, 32)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(cell, name).copy_(getattr(enc.gru, f"{name}_l0"))
    torch.manual_seed(4)
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        out = enc.embed(x, torch.arange(9), None)
        h = torch.zeros(2, 32)  # h_{-1} = 0
        for t in range(9):
            h = cell(x[:, t], h)
            assert torch.allclose(out[:, t], x[:, t] + h if residual else h, atol=1e-5), t


def test_rnn_is_causal():
    enc = make("rnn")
    torch.manual_seed(5)
    x = torch.randn(1, 12, 32)
    y = x.clone()
    y[0, 7:] = torch.randn(5, 32)
    with torch.no_grad():
        a, b = enc.embed(x, torch.arange(12), None), enc.embed(y, torch.arange(12), None)
    assert torch.equal(a[:, :7], b[:, :7]) and not torch.allclose(a[:, 7:], b[:, 7:])


def test_rnn_runs_in_float32_under_bf16_autocast():
    enc = make("rnn")
    x = torch.randn(1, 20, 32)
    with torch.no_grad():
        plain = enc.embed(x, torch.arange(20), None)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            cast = enc.embed(x, torch.arange(20), None)
    assert cast.dtype == torch.float32 and torch.equal(cast, plain)


# ---- inside the model -----------------------------------------------------------------------------


