"""swan (Puvvada et al. 2025, SWAN-GPT) against its definition: every layer's attention computed token
by token in float64 (global NoPE first in each unit of four layers, RoPE over a sliding window in
the other three) and compared with the encoding through posbench's attention kernels; causality;
the layout and the window a config gets."""

import cmath
import math

import pytest
import torch

from posbench.config import ModelConfig
from posbench.encodings import ModelDims, build_encoding
from posbench.errors import PosbenchError
from posbench.model.attention import causal_attention, layer_window
from posbench.model.transformer import LanguageModel

HS, BASE, WINDOW = 8, 10000.0, 5
PAIRS = HS // 2
DIMS = ModelDims(d_model=16, n_heads=2, n_layers=8, train_len=16)


def direct_swan_layer(q, k, v, layer, window, nope_every=4):
    """One SWAN-GPT layer by its definition, in float64: layer l % nope_every == 0 attends to every
    key j <= i with q.k unrotated (NoPE); any other layer rotates pair d = (x_d, x_{d+hs/2}) as a
    complex number times exp(i p theta_d), theta_d = base^(-2d/hs), and attends to the keys
    i - window < j <= i only. Logits Re(sum_d q'_d conj(k'_d)) / sqrt(hs). -> (B, H, T, hs)."""
    B, H, T, hs = q.shape
    nope = layer % nope_every == 0
    theta = [BASE ** (-2 * d / hs) for d in range(PAIRS)]
    out = torch.zeros(B, H, T, hs, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            def turned(x, p):
                return [complex(x[d], x[d + PAIRS]) * (1 if nope else cmath.exp(1j * p * theta[d]))
                        for d in range(PAIRS)]
            rq = [turned(q[b, h, t].tolist(), t) for t in range(T)]
            rk = [turned(k[b, h, t].tolist(), t) for t in range(T)]
            for i in range(T):
                seen = range(0 if nope else max(0, i - window + 1), i + 1)
                logits = torch.tensor([sum((a * c.conjugate()).real for a, c in zip(rq[i], rk[j])) / math.sqrt(hs)
                                       for j in seen], dtype=torch.float64)
                out[b, h, i] = logits.softmax(0) @ v[b, h, list(seen)].double()
    return out


@pytest.mark.parametrize("chunk", [64, 4], ids=["one-chunk", "query-chunks"])
def test_every_layer_matches_the_definition_token_by_token(chunk):
    enc = build_encoding({"name": "swan", "window": WINDOW}, DIMS)
    torch.manual_seed(0)
    T = 13
    q, k, v = (torch.randn(2, 2, T, HS) for _ in range(3))
    pos = torch.arange(T)
    for layer in range(DIMS.n_layers):
        rq, rk = enc.rotate(q, k, pos, layer)
        with torch.no_grad():
            got = causal_attention(rq, rk, v, enc, pos, layer, chunk_size=chunk, cache={},
                                   window=layer_window(enc, layer))
        torch.testing.assert_close(got.double(), direct_swan_layer(q, k, v, layer, WINDOW), atol=1e-5, rtol=1e-5)


def test_layout_is_nope_first_in_every_four_and_the_paper_window():
    enc = build_encoding({"name": "swan"}, DIMS)
    assert [layer for layer in range(8) if enc.is_nope(layer)] == [0, 4]
    assert [enc.attention_window(layer) for layer in range(8)] == [0, 512, 512, 512, 0, 512, 512, 512]
    hybrid = build_encoding({"name": "rope_nope", "window": 512}, DIMS)  # Llama 4 / RNoPE-SWA: NoPE last
    assert [layer for layer in range(8) if hybrid.is_nope(layer)] == [3, 7]
    with pytest.raises(PosbenchError, match=r"swan window must be an integer >= 1 .* got 0"):
        build_encoding({"name": "swan", "window": 0}, DIMS)


def test_a_token_past_the_window_still_reaches_the_query_through_the_nope_layer():
    """Layer 0 (NoPE, global) carries token 0 to token 11, which the RoPE layer's window of 3 hides."""
    cfg = ModelConfig(d_model=16, n_layers=2, n_heads=2, d_ff=32)
    torch.manual_seed(0)
    net = LanguageModel(cfg, 32, build_encoding({"name": "swan", "window": 3, "nope_every": 2},
                                                LanguageModel.dims(cfg, 16, 32))).eval()
    x = torch.randint(0, 32, (1, 12))
    y = x.clone()
    y[0, 0] = (x[0, 0] + 1) % 32
    with torch.no_grad():
        a, b = net(x), net(y)
    assert not torch.allclose(a[0, -1], b[0, -1])


def test_causal():
    cfg = ModelConfig(d_model=16, n_layers=4, n_heads=2, d_ff=32)
    torch.manual_seed(0)
    net = LanguageModel(cfg, 32, build_encoding({"name": "swan", "window": 4}, LanguageModel.dims(cfg, 16, 32))).eval()
    x = torch.randint(0, 32, (2, 16))
    y = x.clone()
    y[:, 9:] = torch.randint(0, 32, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(net(x)[:, :9], net(y)[:, :9])
